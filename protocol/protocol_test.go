package protocol

import (
	"github.com/ckpt-io/ckpt/internal/names"
	"os/exec"
	"reflect"
	"strconv"
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
		`{"op":"restore","task":"t","target":"/data/t","job":"orders"}`,
		`{"op":"checkpoint","task":"t","checkpoint":1,"dir":"/d","job":"orders.v2"}`,
		`{"op":"status","job":"orders"}`,
		`{"op":"checkpoint","task":"t","checkpoint":1,"dir":"/d","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","future_field":true}`,
	} {
		if _, err := DecodeRequest([]byte(line)); err != nil {
			t.Errorf("%s: %v", line, err)
		}
	}
}

func TestDecodeRequestRefusesWithBadRequest(t *testing.T) {
	for _, line := range []string{
		``, `garbage`, `[]`, `{}`, `{"op":"nope"}`, `{"op":"hello"}{"op":"hello"}`,
		`{"op":"hello","id":{"x":1}}`,
		`{"op":"status","task":"-bad"}`,
		`{"op":"checkpoint","task":"t","checkpoint":0,"dir":"/d"}`,
		`{"op":"checkpoint","task":"t","checkpoint":1,"dir":"/d","timeout_ms":604800001}`,
		`{"op":"checkpoint","task":"t","checkpoint":1,"dir":"/d","timeout_ms":-5}`,
		`{"op":"checkpoint","task":"t","checkpoint":1,"dir":"rel"}`,
		`{"op":"checkpoint","task":"t","checkpoint":4611686018427387905,"dir":"/d"}`,
		`{"op":"checkpoint","task":"` + strings.Repeat("a", 129) + `","checkpoint":1,"dir":"/d"}`,
		`{"op":"checkpoint","task":"t","checkpoint":1,"dir":"/d","engine":"` + strings.Repeat("e", 65) + `"}`,
		`{"op":"abort","task":"t"}`,
		`{"op":"restore","task":"t","target":"rel"}`,
		`{"op":"checkpoint","task":"t","checkpoint":"1","dir":"/d"}`,
		`{"op":"checkpoint","task":"t","checkpoint":1,"dir":"/d","job":"../other"}`,
		`{"op":"restore","task":"t","target":"/d","job":"a/b"}`,
		`{"op":"status","job":"-x"}`,
	} {
		if _, err := DecodeRequest([]byte(line)); err == nil || err.Code != CodeBadRequest || err.Message == "" {
			t.Errorf("%.80s: got %v, want a bad_request", line, err)
		}
	}
}

func TestDecodeRequestKeepsTheIDOfARefusedRequest(t *testing.T) {
	req, err := DecodeRequest([]byte(`{"op":"abort","task":"t","id":7}`))
	if err == nil || req.ID == nil || req.ID.(interface{ String() string }).String() != "7" {
		t.Fatalf("id %v, err %v", req.ID, err)
	}
}

func TestTaskNames(t *testing.T) {
	for name, ok := range map[string]bool{
		"t": true, "orders-3": true, "A.b_c-9": true, strings.Repeat("a", 128): true,
		"": false, "-t": false, ".t": false, "_t": false, "a/b": false, "a b": false,
		strings.Repeat("a", 129): false, "é": false,
	} {
		if err := names.Valid("task", name); (err == nil) != ok {
			t.Errorf("%q: %v", name, err)
		}
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

// The protocol needs nothing but the standard library (and ckpt's name
// checks, which need nothing else either), so that anything can speak it
// cheaply.
func TestOnlyTheStandardLibrary(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command(gobin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep != "github.com/ckpt-io/ckpt/protocol" && dep != "github.com/ckpt-io/ckpt/internal/names" {
			t.Errorf("package protocol depends on %s", dep)
		}
	}
}

func TestDecodeRequestChecksTheTasksList(t *testing.T) {
	many := make([]string, MaxTasks+1)
	for i := range many {
		many[i] = `"t` + strconv.Itoa(i) + `"`
	}
	ok := `{"op":"checkpoint","task":"t1","checkpoint":1,"dir":"/d","tasks":["t2","t1"]}`
	if r, err := DecodeRequest([]byte(ok)); err != nil || len(r.Tasks) != 2 {
		t.Fatalf("%s: %v %v", ok, r, err)
	}
	for name, tasks := range map[string]string{
		"without the requesting task": `["t2"]`,
		"empty":                       `[]`,
		"duplicates":                  `["t1","t1"]`,
		"not a task name":             `["t1","a/b"]`,
		"an empty name":               `["t1",""]`,
		"too many":                    "[" + strings.Join(many, ",") + "]",
		"not strings":                 `[1]`,
	} {
		line := `{"op":"checkpoint","task":"t1","checkpoint":1,"dir":"/d","tasks":` + tasks + `}`
		if _, err := DecodeRequest([]byte(line)); err == nil || err.Code != CodeBadRequest {
			t.Errorf("%s: got %v, want bad_request", name, err)
		}
	}
	if _, err := DecodeRequest([]byte(`{"op":"restore","task":"t","target":"/x","job_consistent":true}`)); err != nil {
		t.Errorf("job_consistent restore: %v", err)
	}
	if _, err := DecodeRequest([]byte(`{"op":"restore","task":"t","target":"/x","job_consistent":true,"checkpoint":3}`)); err == nil {
		t.Errorf("job_consistent with a checkpoint: accepted")
	}
}

// The table of ops names only fields a Request has, and every field of a
// Request is read by some op: a field added to one and not the other is
// caught here.
func TestOpTableFieldsAreRequestFields(t *testing.T) {
	tags := map[string]bool{}
	rt := reflect.TypeOf(Request{})
	for i := range rt.NumField() {
		name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
		tags[name] = true
	}
	read := map[string]bool{"op": true, "id": true}
	seen := map[Op]bool{}
	for _, spec := range Ops() {
		if seen[spec.Op] {
			t.Errorf("op %s has two rows", spec.Op)
		}
		seen[spec.Op] = true
		if spec.Final == "" || (spec.Refusal != "error" && spec.Refusal != "failed") {
			t.Errorf("op %s: final event %q, refusal %q", spec.Op, spec.Final, spec.Refusal)
		}
		for _, f := range spec.Fields {
			if !tags[f] {
				t.Errorf("op %s reads field %q, which Request does not have", spec.Op, f)
			}
			read[f] = true
		}
	}
	for tag := range tags {
		if !read[tag] {
			t.Errorf("Request field %q is read by no op of the table", tag)
		}
	}
}

// Every op of the table is decoded, and an op outside it is refused
// naming the ops there.
func TestDecodeRequestKnowsExactlyTheOpsOfTheTable(t *testing.T) {
	for _, spec := range Ops() {
		_, err := DecodeRequest([]byte(`{"op":"` + string(spec.Op) + `"}`))
		if err != nil && strings.Contains(err.Message, "unknown op") {
			t.Errorf("op %s of the table is refused as unknown: %v", spec.Op, err)
		}
	}
	_, err := DecodeRequest([]byte(`{"op":"snapshot"}`))
	if err == nil || !strings.Contains(err.Message, "unknown op") || !strings.Contains(err.Message, string(OpFollow)) {
		t.Errorf("an op outside the table: %v, want unknown op naming the table's ops", err)
	}
}
