package s3

import (
	"fmt"
	"net/http"
	"strings"
)

// actions names the IAM action each operation of the store needs (the
// list docs/iam.md gives). A refused request names it, so that an
// operator fixes the role without guessing.
var actions = map[string]string{
	"put":                    "s3:PutObject",
	"create":                 "s3:PutObject",
	"get":                    "s3:GetObject",
	"stat":                   "s3:GetObject (and s3:ListBucket, without which a missing key answers 403, not 404)",
	"list":                   "s3:ListBucket",
	"delete":                 "s3:DeleteObject",
	"list multipart uploads": "s3:ListBucketMultipartUploads",
	"abort multipart upload": "s3:AbortMultipartUpload",
}

// deniedAction returns the IAM action a refused op needs, or "" when err
// is no refusal.
func deniedAction(op string, err error) string {
	code := errorCode(err)
	if code != "AccessDenied" && code != "AllAccessDisabled" && statusCode(err) != http.StatusForbidden {
		return ""
	}
	if a, ok := actions[op]; ok {
		return a
	}
	if strings.HasPrefix(op, "copy from") {
		return "s3:GetObject on the source and s3:PutObject on the target"
	}
	return "the S3 action of " + op
}

// deniedError says which action a refused request needs.
type deniedError struct {
	action string
	err    error
}

func (e *deniedError) Error() string {
	return fmt.Sprintf("access denied: the agent's role lacks %s on this bucket and prefix (see docs/iam.md): %v", e.action, e.err)
}
func (e *deniedError) Unwrap() error { return e.err }

// PermissionDenied marks the error as a refusal of the caller's
// permissions (the agent shows the task blocked).
func (e *deniedError) PermissionDenied() bool { return true }
