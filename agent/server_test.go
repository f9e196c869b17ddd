package agent

import (
	"bufio"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/ckpt-io/ckpt/protocol"
	"github.com/ckpt-io/ckpt/restore"
)

func TestReadLineSkipsOversizeLinesAndKeepsTheStream(t *testing.T) {
	long := strings.Repeat("x", protocol.MaxLine+1)
	r := bufio.NewReaderSize(strings.NewReader(long+"\n"+`{"op":"hello"}`+"\n"), 4096)
	line, tooLong, err := readLine(r)
	if err != nil || !tooLong || line != nil {
		t.Fatalf("oversize line: %d bytes, tooLong=%v, err=%v", len(line), tooLong, err)
	}
	line, tooLong, err = readLine(r)
	if err != nil || tooLong || string(line) != `{"op":"hello"}` {
		t.Fatalf("next line: %q %v %v", line, tooLong, err)
	}
	exact := strings.Repeat("y", protocol.MaxLine)
	r = bufio.NewReaderSize(strings.NewReader(exact+"\n"), 4096)
	if line, tooLong, _ := readLine(r); tooLong || len(line) != protocol.MaxLine {
		t.Fatalf("a line of exactly 1 MiB was refused")
	}
}

// TestTheRestoredEventCarriesEveryFieldOfRestoreJSON: the restored event
// has the same fields as `ckpt restore --json`, whatever fields
// restore.Result grows.
func TestTheRestoredEventCarriesEveryFieldOfRestoreJSON(t *testing.T) {
	var res restore.Result
	v := reflect.ValueOf(&res).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		if !f.CanSet() {
			continue
		}
		switch f.Kind() {
		case reflect.Bool:
			f.SetBool(true)
		case reflect.String:
			f.SetString("s" + v.Type().Field(i).Name)
		case reflect.Int, reflect.Int64:
			f.SetInt(int64(100 + i))
		case reflect.Uint64:
			f.SetUint(uint64(200 + i))
		default:
			t.Fatalf("restore.Result.%s: kind %s not covered by this test", v.Type().Field(i).Name, f.Kind())
		}
	}
	for _, r := range []*restore.Result{&res, {Restored: false, Reason: "the target already holds a store"}} {
		var want, got map[string]any
		b, _ := json.Marshal(r)
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatal(err)
		}
		want["event"], want["id"] = "restored", "r1"
		b, _ = json.Marshal(protocol.Event{Event: "restored", ID: "r1", Restored: restored(r)})
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("restored event\n got %v\nwant %v", got, want)
		}
	}
	if restored(nil) != nil {
		t.Error("a nil result gave a Restored")
	}
}
