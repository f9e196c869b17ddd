package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// backendCalls returns the distinct matches of re's groups in the
// non-test Go files of storage/<backend>.
func backendCalls(t *testing.T, backend string, re *regexp.Regexp) map[string]bool {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "storage", backend, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			for _, g := range m[1:] {
				if g != "" {
					calls[g] = true
				}
			}
		}
	}
	return calls
}

// TestTheDocumentedIAMCoversEveryCallOfTheS3AndGCSBackends reads the s3 and
// gs backends' source for the API calls they make and checks that each
// maps to a permission deploy/README.md lists, and that the README lists
// no permission that no call needs. A call this table does not know fails
// the test: document its permission, then add it here.
func TestTheDocumentedIAMCoversEveryCallOfTheS3AndGCSBackends(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "deploy", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(readme)
	documented := func(re string) map[string]bool {
		out := map[string]bool{}
		for _, m := range regexp.MustCompile(re).FindAllStringSubmatch(doc, -1) {
			out[m[1]] = true
		}
		return out
	}
	for _, tc := range []struct {
		backend string
		calls   *regexp.Regexp
		perms   map[string][]string // call → permissions
		listed  map[string]bool
	}{
		{
			backend: "s3",
			calls:   regexp.MustCompile(`(?:client\.|s3\.New)([A-Z][A-Za-z0-9]+?)(?:Paginator)?\(|tm\.([A-Z][A-Za-z]+)\(`),
			perms: map[string][]string{
				"HeadBucket": {"s3:ListBucket"}, "ListObjectsV2": {"s3:ListBucket"},
				"GetObject": {"s3:GetObject"}, "HeadObject": {"s3:GetObject"},
				"PutObject": {"s3:PutObject"}, "CreateMultipartUpload": {"s3:PutObject"}, "UploadPart": {"s3:PutObject"},
				"CompleteMultipartUpload": {"s3:PutObject"}, "UploadObject": {"s3:PutObject", "s3:AbortMultipartUpload"},
				"CopyObject":    {"s3:GetObject", "s3:PutObject"},
				"DeleteObjects": {"s3:DeleteObject"}, "AbortMultipartUpload": {"s3:AbortMultipartUpload"},
				"ListMultipartUploads": {"s3:ListBucketMultipartUploads"}, "ListParts": {"s3:ListMultipartUploadParts"},
				"FromConfig": nil, // s3.NewFromConfig: the client, no call
			},
			listed: documented("\\| `(s3:[A-Za-z]+)` \\|"),
		},
		{
			backend: "gs",
			calls:   regexp.MustCompile(`\.(Attrs|Objects|NewReader|NewRangeReader|NewWriter|CopierFrom|ComposerFrom|Delete|Update|Create|IAM|SignedURL|ACL)\(`),
			perms: map[string][]string{
				// bucket.Attrs (the probe) and obj.Attrs: both match "Attrs".
				"Attrs":   {"storage.buckets.get", "storage.objects.get"},
				"Objects": {"storage.objects.list"}, "NewReader": {"storage.objects.get"}, "NewRangeReader": {"storage.objects.get"},
				"NewWriter":  {"storage.objects.create", "storage.objects.delete"}, // an overwrite needs delete
				"CopierFrom": {"storage.objects.get", "storage.objects.create"},
				"Delete":     {"storage.objects.delete"},
			},
			listed: documented("\\| `(storage\\.[a-z]+\\.[a-z]+)` \\|"),
		},
	} {
		calls := backendCalls(t, tc.backend, tc.calls)
		t.Logf("%s backend calls: %v", tc.backend, calls)
		if len(calls) < 5 {
			t.Fatalf("%s: found only calls %v in the backend's source", tc.backend, calls)
		}
		needed := map[string]bool{}
		for c := range calls {
			p, ok := tc.perms[c]
			if !ok {
				t.Errorf("%s: the backend calls %s, whose permission deploy/README.md does not say: document it and add it here", tc.backend, c)
			}
			for _, x := range p {
				needed[x] = true
				if !tc.listed[x] {
					t.Errorf("%s: %s needs %s, which deploy/README.md does not list", tc.backend, c, x)
				}
			}
		}
		for x := range tc.listed {
			if !needed[x] {
				t.Errorf("%s: deploy/README.md lists %s, which no call of the backend needs", tc.backend, x)
			}
		}
		if len(tc.listed) == 0 {
			t.Errorf("%s: deploy/README.md lists no permission", tc.backend)
		}
	}
}
