package e2e

import (
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
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
	faultStall       fault = "stalled (accepted, never answered)"
)

// faultMix is the share of requests that get each fault (the rest are
// forwarded untouched), and the longest injected delay.
type faultMix struct {
	SlowDown, Internal, ResetBefore, ResetAfter, Latency float64
	MaxDelay                                             time.Duration
}

// failing is the share of requests that fail (delays excluded).
func (m faultMix) failing() float64 { return m.SlowDown + m.Internal + m.ResetBefore + m.ResetAfter }

// heavyFaults fails about 16% of requests and delays 10% more by up to
// 150 ms: a storage service having a bad day.
var heavyFaults = faultMix{SlowDown: 0.06, Internal: 0.04, ResetBefore: 0.03, ResetAfter: 0.03, Latency: 0.10, MaxDelay: 150 * time.Millisecond}

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
	mix    faultMix

	mu      sync.Mutex
	rng     *rand.Rand
	enabled bool
	// rule, when set, decides the fault of a request before the random mix
	// (ok false: no decision).
	rule   func(r *http.Request) (f fault, ok bool)
	counts map[fault]int
	log    []string // the faults injected, by request (the newest maxFaultLog)
}

// maxFaultLog bounds the fault log of a long run.
const maxFaultLog = 4096

// startFaultProxy starts a proxy in front of target with the heavy mix,
// its faults disabled until set enables them.
func startFaultProxy(t *testing.T, target string, seed uint64) *faultProxy {
	t.Helper()
	return startFaultProxyMix(t, target, seed, heavyFaults)
}

// startFaultProxyMix starts a proxy in front of target that injects mix
// once set enables it. It stops when the test ends.
func startFaultProxyMix(t *testing.T, target string, seed uint64, mix faultMix) *faultProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{target: u, mix: mix, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), counts: map[fault]int{},
		tr: &http.Transport{MaxIdleConnsPerHost: 16}}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(u)
			r.Out.Host = r.In.Host // signed by SigV4
		},
		Transport: p.tr,
		// A client that goes away mid-request (a killed agent) is expected.
		ErrorLog: log.New(io.Discard, "", 0),
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

// tally returns the number of requests seen, failed (answered with an
// error or reset) and delayed.
func (p *faultProxy) tally() (requests, failed, delayed int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for f, n := range p.counts {
		requests += n
		switch f {
		case faultNone:
		case faultLatency:
			delayed += n
		default:
			failed += n
		}
	}
	return requests, failed, delayed
}

// faultLog returns the newest injected faults, one a line.
func (p *faultProxy) faultLog() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.log, "\n")
}

// pick decides a request's fault: the rule first, then the seeded mix.
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
		m := p.mix
		switch x := p.rng.Float64(); {
		case x < m.SlowDown:
			f = faultSlowDown
		case x < m.SlowDown+m.Internal:
			f = faultInternal
		case x < m.SlowDown+m.Internal+m.ResetBefore:
			f = faultResetBefore
		case x < m.failing():
			f = faultResetAfter
		case x < m.failing()+m.Latency && m.MaxDelay > 0:
			f = faultLatency
			delay = time.Duration(p.rng.Int64N(int64(m.MaxDelay)))
		}
	}
	p.counts[f]++
	if f != faultNone {
		if len(p.log) >= maxFaultLog {
			p.log = append(p.log[:0], p.log[maxFaultLog/2:]...)
		}
		p.log = append(p.log, fmt.Sprintf("%s %s %s: %s", time.Now().Format("15:04:05.000"), r.Method, r.URL.Path, f))
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
	case faultStall:
		io.Copy(io.Discard, r.Body)
		<-r.Context().Done() // until the client gives up
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

// s3ViaProxy returns the storage URL and environment of a ckpt process
// that reaches srv through proxy.
func s3ViaProxy(srvEnv []string, region string, proxy *faultProxy) (storageURL string, env []string) {
	storageURL = "s3://" + testBucket + "/" + testPrefix + "?" + url.Values{"path_style": {"true"}, "endpoint": {proxy.url}, "region": {region}}.Encode()
	env = append(append([]string(nil), srvEnv...), "AWS_ENDPOINT_URL="+proxy.url)
	return storageURL, env
}
