package storage

import (
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Locator is implemented by backends that can say where their objects
// live, resolved: Location returns a storage URL that Overlap reads the
// same way for every store reaching the same objects (a file:// store's
// real path, with symlinks resolved; an object store's endpoint, bucket
// and prefix).
type Locator interface {
	Location() string
}

// LocationOf returns s's Location (of the backend s's decorators wrap),
// or s.String() for a backend without one.
func LocationOf(s Store) string {
	if l, ok := find[Locator](s); ok {
		return l.Location()
	}
	return s.String()
}

// where is a storage URL resolved to what it reaches: a directory on this
// machine, or a prefix of a bucket at a service.
type where struct {
	file    bool
	service string   // object stores: the endpoint, normalized
	bucket  string   // lower case
	segs    []string // the directory's or the prefix's path segments, cleaned
}

// endpointEnv are the environment variables that pick an endpoint for a
// URL that names none, per scheme (the backends read the same ones).
var endpointEnv = map[string][]string{
	"s3": {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"},
	"gs": {"STORAGE_EMULATOR_HOST"},
}

// defaultService is the service a URL without endpoint reaches.
var defaultService = map[string]string{"s3": "aws", "gs": "gcs"}

// locate resolves a storage URL (as given, or as Location or String
// returns it). A file:// path is made real: symlinks in the longest part
// of it that exists are resolved, the rest is cleaned. An object store's
// scheme and bucket are compared in lower case, its prefix cleaned of
// "//", "." and "..", and its endpoint taken from ?endpoint= or, when the
// URL has none, from the environment as the backend would.
func locate(raw string) (where, bool) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.Scheme == "" {
		return where{}, false
	}
	// A scheme a plugin serves beside a built-in backend (s3+plugin)
	// reaches the same service.
	scheme, _, _ := strings.Cut(strings.ToLower(u.Scheme), "+")
	if scheme == "file" {
		if u.Path == "" || !filepath.IsAbs(u.Path) {
			return where{}, false
		}
		return where{file: true, segs: split(realPath(u.Path))}, true
	}
	if u.Host == "" {
		return where{}, false
	}
	w := where{bucket: strings.ToLower(u.Host), segs: split(path.Clean("/" + u.Path))}
	endpoint, given := "", u.Query().Has("endpoint")
	if given {
		endpoint = u.Query().Get("endpoint")
	} else {
		for _, k := range endpointEnv[scheme] {
			if v := os.Getenv(k); v != "" {
				endpoint = v
				break
			}
		}
	}
	w.service = normalizeEndpoint(scheme, endpoint)
	return w, true
}

// normalizeEndpoint names the service an endpoint reaches: host and port
// in lower case without a default port, loopback names as one; the
// providers' own hosts as the provider; no endpoint as the scheme's
// provider.
func normalizeEndpoint(scheme, endpoint string) string {
	endpoint = strings.TrimSpace(endpoint)
	if endpoint == "" {
		if d, ok := defaultService[scheme]; ok {
			return d
		}
		return scheme
	}
	if !strings.Contains(endpoint, "://") {
		endpoint = "http://" + endpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return strings.ToLower(strings.TrimRight(endpoint, "/"))
	}
	host, port := strings.ToLower(u.Hostname()), u.Port()
	switch {
	case host == "amazonaws.com" || strings.HasSuffix(host, ".amazonaws.com"):
		return "aws"
	case host == "storage.googleapis.com" || host == "www.googleapis.com":
		return "gcs"
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		host = "loopback"
	}
	if (port == "80" && u.Scheme == "http") || (port == "443" && u.Scheme == "https") {
		port = ""
	}
	if port != "" {
		return host + ":" + port
	}
	return host
}

// realPath resolves the symlinks of the longest existing part of the
// absolute path p and cleans the rest.
func realPath(p string) string {
	p = filepath.Clean(p)
	var rest []string
	for cur := p; ; {
		if r, err := filepath.EvalSymlinks(cur); err == nil {
			return filepath.Join(append([]string{r}, rest...)...)
		}
		parent := filepath.Dir(cur)
		if parent == cur {
			return p
		}
		rest = append([]string{filepath.Base(cur)}, rest...)
		cur = parent
	}
}

func split(p string) []string {
	var out []string
	for _, s := range strings.Split(p, "/") {
		if s != "" && s != "." {
			out = append(out, s)
		}
	}
	return out
}

// Overlap reports whether two storage URLs reach the same objects, or
// one reaches into the other: the same directory or one inside the other
// (after resolving symlinks), or the same bucket at the same service with
// one prefix equal to or under the other. A URL that cannot be resolved
// is compared as cleaned text, so that Overlap errs towards true.
func Overlap(a, b string) bool {
	wa, oka := locate(a)
	wb, okb := locate(b)
	if !oka || !okb {
		ta, tb := strings.TrimRight(a, "/"), strings.TrimRight(b, "/")
		return ta == tb || strings.HasPrefix(ta, tb+"/") || strings.HasPrefix(tb, ta+"/")
	}
	if wa.file != wb.file || wa.service != wb.service || wa.bucket != wb.bucket {
		return false
	}
	n := min(len(wa.segs), len(wb.segs))
	for i := range n {
		if wa.segs[i] != wb.segs[i] {
			return false
		}
	}
	return true
}
