package s3

import (
	"errors"
	"strings"
	"testing"

	"github.com/aws/smithy-go"
)

// A refused request names the IAM action the operation needs, and is
// marked as a permission refusal.
func TestAnAccessDeniedNamesTheAction(t *testing.T) {
	s := &Store{bucket: "b"}
	for op, want := range map[string]string{"put": "s3:PutObject", "list": "s3:ListBucket", "delete": "s3:DeleteObject",
		"list multipart uploads": "s3:ListBucketMultipartUploads", "abort multipart upload": "s3:AbortMultipartUpload"} {
		err := s.wrap(op, "k", &smithy.GenericAPIError{Code: "AccessDenied", Message: "Access Denied"})
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s refused: %q does not name %s", op, err, want)
		}
		var pd interface{ PermissionDenied() bool }
		if !errors.As(err, &pd) || !pd.PermissionDenied() {
			t.Errorf("%s refused: %v is not marked as a permission refusal", op, err)
		}
	}
	if err := s.wrap("put", "k", &smithy.GenericAPIError{Code: "SlowDown"}); strings.Contains(err.Error(), "access denied") {
		t.Errorf("a throttled put reads as access denied: %v", err)
	}
}
