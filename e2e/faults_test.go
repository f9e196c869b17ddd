package e2e

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ckpt-io/ckpt/internal/testservers"
)

// fault is what the proxy does to one request.
type fault string

const (
	faultNone        fault = "forwarded"
	faultSlowDown    fault = "503 SlowDown"
	faultInternal    fault = "500 InternalError"
	faultResetBefore fault = "reset before forwarding"
	faultResetAfter  fault = "reset after forwarding (response lost)"
	faultLatency     fault = "delayed"
)

// faultProxy is a loopback HTTP proxy in front of an S3 server that fails
// a seeded share of requests the way S3 and networks do: 503 SlowDown and
// 500 InternalError answers with S3's XML error bodies, connections reset
// before the request reaches the server or after the server applied it
// (the client never sees the answer), and bounded latency. It keeps the
// client's Host header, so SigV4 signatures stay valid.
type faultProxy struct {
	target *url.URL
	rp     *httputil.ReverseProxy
	tr     *http.Transport
	url    string

	mu      sync.Mutex
	rng     *rand.Rand
	enabled bool
	// rule, when set, decides the fault of a request before the random mix
	// (ok false: no decision).
	rule   func(r *http.Request) (f fault, ok bool)
	counts map[fault]int
	log    []string // the faults injected, by request
}

func startFaultProxy(t *testing.T, target string, seed uint64) *faultProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{target: u, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), counts: map[fault]int{},
		tr: &http.Transport{MaxIdleConnsPerHost: 16}}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(u)
			r.Out.Host = r.In.Host // signed by SigV4
		},
		Transport: p.tr,
		ErrorLog:  nil,
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.url = "http://" + l.Addr().String()
	srv := &http.Server{Handler: p}
	go srv.Serve(l)
	t.Cleanup(func() {
		srv.Close()
		p.tr.CloseIdleConnections()
	})
	return p
}

// set enables or disables the random faults and sets the rule.
func (p *faultProxy) set(enabled bool, rule func(*http.Request) (fault, bool)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.enabled, p.rule = enabled, rule
}

// summary returns the injected faults by kind.
func (p *faultProxy) summary() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var parts []string
	for f, n := range p.counts {
		parts = append(parts, fmt.Sprintf("%s: %d", f, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// pick decides a request's fault: the rule first, then the seeded mix
// (about 16% of requests fail, 10% more are delayed up to 150 ms).
func (p *faultProxy) pick(r *http.Request) (fault, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := faultNone
	var delay time.Duration
	if p.rule != nil {
		if rf, ok := p.rule(r); ok {
			f = rf
		}
	}
	if f == faultNone && p.enabled {
		switch x := p.rng.Float64(); {
		case x < 0.06:
			f = faultSlowDown
		case x < 0.10:
			f = faultInternal
		case x < 0.13:
			f = faultResetBefore
		case x < 0.16:
			f = faultResetAfter
		case x < 0.26:
			f = faultLatency
			delay = time.Duration(p.rng.Int64N(int64(150 * time.Millisecond)))
		}
	}
	p.counts[f]++
	if f != faultNone {
		p.log = append(p.log, fmt.Sprintf("%s %s: %s", r.Method, r.URL.Path, f))
	}
	return f, delay
}

func (p *faultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f, delay := p.pick(r)
	switch f {
	case faultSlowDown:
		s3Error(w, http.StatusServiceUnavailable, "SlowDown", "Please reduce your request rate.")
	case faultInternal:
		s3Error(w, http.StatusInternalServerError, "InternalError", "We encountered an internal error. Please try again.")
	case faultResetBefore:
		resetConn(w)
	case faultResetAfter:
		out := r.Clone(r.Context())
		out.RequestURI = ""
		out.URL.Scheme, out.URL.Host = p.target.Scheme, p.target.Host
		out.Host = r.Host
		if r.ContentLength == 0 {
			out.Body = http.NoBody
		}
		resp, err := p.tr.RoundTrip(out)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		resetConn(w)
	case faultLatency:
		time.Sleep(delay)
		p.rp.ServeHTTP(w, r)
	default:
		p.rp.ServeHTTP(w, r)
	}
}

// s3Error answers with an S3 error document.
func s3Error(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/xml")
	w.Header().Set("Connection", "close")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+`<Error><Code>%s</Code><Message>%s</Message><RequestId>fault-injected</RequestId></Error>`, code, msg)
}

// resetConn closes the client's connection with a TCP reset.
func resetConn(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic("faultProxy: no hijacker")
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	conn.Close()
}

// isManifestPut matches the commit of a checkpoint: the manifest's PUT.
func isManifestPut(r *http.Request) bool {
	return r.Method == http.MethodPut && manifestRE.MatchString(r.URL.Path)
}

func TestCheckpointsCompleteThroughS3FaultsAndNoListedCheckpointLacksAnObject(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, testBucket)
	direct := &backend{name: "s3", url: srv.URL(testBucket, testPrefix), env: srv.Env(), root: srv.DataDir, s3: srv}
	proxy := startFaultProxy(t, srv.Endpoint, 20261129)
	viaProxy := "s3://" + testBucket + "/" + testPrefix + "?" + url.Values{"path_style": {"true"}, "endpoint": {proxy.url}, "region": {srv.Region}}.Encode()
	env := append(srv.Env(), "AWS_ENDPOINT_URL="+proxy.url)

	root, localDir := t.TempDir(), t.TempDir()
	socket := filepath.Join(shortDir(t), "ckpt.sock")
	const job, task = "faults", "faults-0"
	startAgent(t, "A", agentConfig{Socket: socket, Storage: viaProxy, Env: env, Job: job, LocalDir: localDir,
		AllowRoots: []string{root}, Extra: []string{"--gc-interval", "1ms", "--commit-patience", "5s"}}) // GC after every checkpoint, through the faults; a refused commit fails within seconds

	proxy.set(true, nil) // after the agent's start-up probe

	// checkListed requires every checkpoint `ckpt list` shows (read
	// straight from the server) to have all its objects.
	checkListed := func(t *testing.T) []listEntry {
		t.Helper()
		list := direct.list(t, job)
		for _, e := range list {
			direct.requireObjectsOf(t, direct.manifest(t, job, e.Task, e.Checkpoint))
		}
		return list
	}
	checkCompleted := func(t *testing.T, n uint64, snap string) {
		t.Helper()
		m := direct.manifest(t, job, task, n)
		direct.requireObjectsOf(t, m)
		want := fileHashes(t, snap)
		for _, f := range m.Files {
			if want[f.Name] != fmt.Sprintf("%s-%d", f.SHA256, f.Size) {
				t.Errorf("checkpoint %d: the manifest's %s does not match the snapshot", n, f.Name)
			}
		}
		if len(m.Files) != len(want) {
			t.Errorf("checkpoint %d: the manifest names %d files, the snapshot has %d", n, len(m.Files), len(want))
		}
	}

	// writeSnap makes checkpoint n's snapshot: the SSTs of the previous
	// one, six new 512 KiB SSTs (and a 24 MiB one, a multipart upload, in
	// checkpoint 3), new private files.
	var prev string
	writeSnap := func(n uint64) string {
		snap := filepath.Join(root, fmt.Sprintf("snap-%d", n))
		if prev != "" {
			linkFiles(t, prev, snap)
			for _, name := range []string{"CURRENT", "MANIFEST-000001", "OPTIONS-000003"} {
				if err := removeFile(filepath.Join(snap, name)); err != nil {
					t.Fatal(err)
				}
			}
		}
		for i := range uint64(6) {
			id := n*10 + i
			writeFile(t, filepath.Join(snap, fmt.Sprintf("%06d.sst", id)), randomBytes(512<<10, 7000+id))
		}
		if n == 3 {
			writeFile(t, filepath.Join(snap, "000039.sst"), randomBytes(24<<20, 7039))
		}
		writeFile(t, filepath.Join(snap, "CURRENT"), []byte("MANIFEST-000001\n"))
		writeFile(t, filepath.Join(snap, "MANIFEST-000001"), randomBytes(64<<10+int(n), 7100+n))
		writeFile(t, filepath.Join(snap, "OPTIONS-000003"), []byte(fmt.Sprintf("[Options]\n  n=%d\n", n)))
		prev = snap
		return snap
	}

	// Random faults: every checkpoint completes by retrying.
	n := uint64(0)
	for range 5 {
		n++
		snap := writeSnap(n)
		ev := trigger(t, socket, task, n, snap)
		t.Logf("checkpoint %d completed through faults in %d ms (uploaded %d, reused %d)", n, ev.DurationMS, ev.FilesUploaded, ev.FilesReused)
		checkCompleted(t, n, snap)
		checkListed(t)
	}
	t.Logf("faults so far: %s", proxy.summary())

	// An outage of the commit: the manifest's PUT always answers 503. The
	// checkpoint fails, and no listed checkpoint lacks an object.
	proxy.set(true, func(r *http.Request) (fault, bool) { return faultSlowDown, isManifestPut(r) })
	n++
	failedN := n
	snap := writeSnap(n)
	o := triggerAsync(socket, task, n, snap)
	if o.err != nil || o.code != 1 || o.ev.Event != "failed" {
		t.Fatalf("checkpoint %d with every commit refused: exit %d, %+v, %v\nstderr: %s", n, o.code, o.ev, o.err, o.stder)
	}
	t.Logf("checkpoint %d with the commit refused: %s: %s", n, o.ev.Error.Code, o.ev.Error.Message)
	if direct.hasManifest(t, job, task, n) {
		t.Errorf("checkpoint %d failed but its manifest is in storage", n)
	}
	for _, e := range checkListed(t) {
		if e.Checkpoint == failedN {
			t.Errorf("list shows the failed checkpoint %d", failedN)
		}
	}

	// The commit's answer is lost once: the server stored the manifest, the
	// agent saw a reset. Its retry must recognise its own manifest.
	var lost sync.Once
	proxy.set(true, func(r *http.Request) (fault, bool) {
		hit := false
		if isManifestPut(r) {
			lost.Do(func() { hit = true })
		}
		return faultResetAfter, hit
	})
	n++
	snap = writeSnap(n)
	o = triggerAsync(socket, task, n, snap)
	if o.err != nil || o.code != 0 || o.ev.Event != "completed" {
		t.Errorf("checkpoint %d whose commit answer was lost: exit %d, %+v, %v\nstderr: %s", n, o.code, o.ev, o.err, o.stder)
	} else {
		checkCompleted(t, n, snap)
	}
	checkListed(t)

	// Faults off: the agent goes on.
	proxy.set(false, nil)
	n++
	snap = writeSnap(n)
	trigger(t, socket, task, n, snap)
	checkCompleted(t, n, snap)
	list := checkListed(t)
	t.Logf("faults injected: %s; listed: %+v", proxy.summary(), list)
	direct.verify(t, job)
	target, _, _ := direct.restoreFromStorage(t, job, task)
	requireSameFiles(t, snap, target)
	if t.Failed() {
		proxy.mu.Lock()
		t.Logf("fault log:\n%s", strings.Join(proxy.log, "\n"))
		proxy.mu.Unlock()
	}
}

func removeFile(p string) error { return os.Remove(p) }
