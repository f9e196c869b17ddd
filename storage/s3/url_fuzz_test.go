package s3

import (
	"net/url"
	"strings"
	"testing"
)

// FuzzParseURL: whatever the text of an s3:// URL, ParseURL never panics,
// refuses credentials in the URL without echoing them, and on success
// names a bucket and a prefix with no slash at either end.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"s3://bucket/prefix", "s3://bucket", "s3://b/p?path_style=true&region=us-east-1",
		"s3://b/p?endpoint=http://127.0.0.1:9000&sse=aws:kms&sse_kms_key_id=k", "s3:///nobucket",
		"s3://user:secret@b/p", "s3://b/p?path_style=maybe", "s3://b/p?unknown=1", "s3://b//a//b//",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		o, err := ParseURL(u)
		if err != nil {
			if u.User != nil {
				// The message names the bucket and path; a password that is
				// also part of those is not told by it.
				if pw, ok := u.User.Password(); ok && len(pw) > 3 && strings.Contains(err.Error(), pw) && !strings.Contains(u.Host+u.Path, pw) {
					t.Fatalf("error %q echoes the password", err)
				}
			}
			return
		}
		if o.Bucket == "" || strings.HasPrefix(o.Prefix, "/") || strings.HasSuffix(o.Prefix, "/") {
			t.Fatalf("ParseURL(%q) = bucket %q prefix %q", raw, o.Bucket, o.Prefix)
		}
	})
}
