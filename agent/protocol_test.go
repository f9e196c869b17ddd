package agent

import (
	"bufio"
	"strings"
	"testing"
)

func TestDecodeRequestAcceptsTheContract(t *testing.T) {
	for _, line := range []string{
		`{"op":"hello"}`,
		`{"op":"status"}`,
		`{"op":"status","task":"orders-3"}`,
		`{"op":"checkpoint","task":"orders-3","checkpoint":42,"dir":"/data/x","engine":"pebble","id":"a1"}`,
		`{"op":"abort","task":"t","checkpoint":1,"id":3}`,
		`{"op":"restore","task":"t","target":"/data/t"}`,
		`{"op":"checkpoint","task":"t","checkpoint":1,"dir":"/d","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","future_field":true}`,
	} {
		if _, err := DecodeRequest([]byte(line)); err != nil {
			t.Errorf("%s: %v", line, err)
		}
	}
}

func TestReadLineSkipsOversizeLinesAndKeepsTheStream(t *testing.T) {
	long := strings.Repeat("x", MaxLine+1)
	r := bufio.NewReaderSize(strings.NewReader(long+"\n"+`{"op":"hello"}`+"\n"), 4096)
	line, tooLong, err := readLine(r)
	if err != nil || !tooLong || line != nil {
		t.Fatalf("oversize line: %d bytes, tooLong=%v, err=%v", len(line), tooLong, err)
	}
	line, tooLong, err = readLine(r)
	if err != nil || tooLong || string(line) != `{"op":"hello"}` {
		t.Fatalf("next line: %q %v %v", line, tooLong, err)
	}
	exact := strings.Repeat("y", MaxLine)
	r = bufio.NewReaderSize(strings.NewReader(exact+"\n"), 4096)
	if line, tooLong, _ := readLine(r); tooLong || len(line) != MaxLine {
		t.Fatalf("a line of exactly 1 MiB was refused")
	}
}

// FuzzDecodeRequest: whatever the bytes, the decoder returns a request or a
// bad_request error, never panics, and what it accepts is valid.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"op":"hello"}`, `{"op":"checkpoint","task":"t","checkpoint":1,"dir":"/d"}`,
		`{"op":"abort","task":"t","checkpoint":18446744073709551615}`, `{"op":"status","task":""}`,
		`{"op":"restore","task":"t","target":"rel"}`, `garbage`, `{}`, `{"op":null}`, `[]`, `{"op":"hello"}{"op":"hello"}`,
		`{"op":"checkpoint","task":"t","checkpoint":1e3,"dir":"/d"}`, `{"id":{"x":1},"op":"hello"}`, "\x00\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		req, err := DecodeRequest(line)
		if err != nil {
			if err.Code != CodeBadRequest || err.Message == "" {
				t.Fatalf("error %+v is not a bad_request with a message", err)
			}
			return
		}
		switch req.Op {
		case "hello", "status", "checkpoint", "abort", "restore":
		default:
			t.Fatalf("accepted op %q", req.Op)
		}
		if req.Op == "checkpoint" && (req.Checkpoint == 0 || !strings.HasPrefix(req.Dir, "/") || req.Task == "") {
			t.Fatalf("accepted invalid checkpoint request %+v", req)
		}
	})
}
