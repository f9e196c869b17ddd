package gs

import (
	"net/url"
	"strings"
	"testing"
)

// FuzzParseURL: whatever the text of a gs:// URL, ParseURL never panics,
// refuses credentials and parameters, and on success names a bucket and a
// prefix with no slash at either end.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"gs://bucket/prefix", "gs://bucket", "gs:///p", "gs://u:p@b/x", "gs://b/p?x=1", "gs://b//p//"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		o, err := ParseURL(u)
		if err != nil {
			return
		}
		if u.User != nil || u.RawQuery != "" {
			t.Fatalf("ParseURL(%q) accepted credentials or parameters", raw)
		}
		if o.Bucket == "" || strings.HasPrefix(o.Prefix, "/") || strings.HasSuffix(o.Prefix, "/") {
			t.Fatalf("ParseURL(%q) = bucket %q prefix %q", raw, o.Bucket, o.Prefix)
		}
	})
}
