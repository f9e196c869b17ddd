package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/protocol"
	"github.com/ckpt-io/ckpt/restore"
)

func TestReadLineSkipsOversizeLinesAndKeepsTheStream(t *testing.T) {
	long := strings.Repeat("x", protocol.MaxLine+1)
	r := &lineReader{r: bufio.NewReaderSize(strings.NewReader(long+"\n"+`{"op":"hello"}`+"\r\n"+`{"op":"status"}`), 4096)}
	line, tooLong, err := r.next()
	if err != nil || !tooLong || line != nil {
		t.Fatalf("oversize line: %d bytes, tooLong=%v, err=%v", len(line), tooLong, err)
	}
	line, tooLong, err = r.next()
	if err != nil || tooLong || string(line) != `{"op":"hello"}` {
		t.Fatalf("next line: %q %v %v", line, tooLong, err)
	}
	line, tooLong, err = r.next()
	if err != nil || tooLong || string(line) != `{"op":"status"}` {
		t.Fatalf("last line without a newline: %q %v %v", line, tooLong, err)
	}
	if _, _, err := r.next(); err != io.EOF {
		t.Fatalf("after the last line: %v, want EOF", err)
	}
	for _, n := range []int{protocol.MaxLine, protocol.MaxLine + 1} {
		exact := strings.Repeat("y", n)
		r = &lineReader{r: bufio.NewReaderSize(strings.NewReader(exact+"\r\n"), 4096)}
		line, tooLong, _ := r.next()
		if want := n > protocol.MaxLine; tooLong != want || (!want && len(line) != n) {
			t.Fatalf("a line of %d bytes: tooLong=%v len=%d", n, tooLong, len(line))
		}
	}
}

// TestAPartialLineSurvivesATimedOutRead: a read deadline that passes in
// the middle of a line (the idle timeout of a busy connection) loses
// nothing of it.
func TestAPartialLineSurvivesATimedOutRead(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	r := &lineReader{r: bufio.NewReaderSize(b, 4096)}
	go io.WriteString(a, `{"op":`)
	b.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, _, err := r.next(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with a deadline: %v", err)
	}
	b.SetReadDeadline(time.Time{})
	go io.WriteString(a, `"hello"}`+"\n")
	line, _, err := r.next()
	if err != nil || string(line) != `{"op":"hello"}` {
		t.Fatalf("line after a timed-out read: %q %v", line, err)
	}
}

// TestTheRestoredEventCarriesEveryFieldOfRestoreJSON: the restored event
// has the same fields as `ckpt restore --json`, whatever fields
// restore.Result grows.
func TestTheRestoredEventCarriesEveryFieldOfRestoreJSON(t *testing.T) {
	var res restore.Result
	v := reflect.ValueOf(res.Outcome()).Elem()
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
		case reflect.Pointer:
			if f.Type() != reflect.TypeFor[*protocol.WALPosition]() {
				t.Fatalf("restore.Result.%s: type %s not covered by this test", v.Type().Field(i).Name, f.Type())
			}
			f.Set(reflect.ValueOf(&protocol.WALPosition{Checkpoint: 7, Epoch: 2, Seq: 3, Log: "000009.log", Offset: 4096}))
		default:
			t.Fatalf("restore.Result.%s: kind %s not covered by this test", v.Type().Field(i).Name, f.Kind())
		}
	}
	var skipped restore.Result
	skipped.Reason = "the target already holds a store"
	for _, r := range []*restore.Result{&res, &skipped} {
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
