package s3

import (
	"fmt"
	"net/http"

	"github.com/ckpt-io/ckpt/storage"
)

// actions names the IAM action each operation of the store needs (the
// list docs/iam.md gives). A refused request names it, so that an
// operator fixes the role without guessing.
var actions = storage.Needs{
	Ops: map[string]string{
		"put":                    "s3:PutObject",
		"create":                 "s3:PutObject",
		"get":                    "s3:GetObject",
		"stat":                   "s3:GetObject (and s3:ListBucket, without which a missing key answers 403, not 404)",
		"list":                   "s3:ListBucket",
		"delete":                 "s3:DeleteObject",
		"list multipart uploads": "s3:ListBucketMultipartUploads",
		"abort multipart upload": "s3:AbortMultipartUpload",
	},
	Copy: "s3:GetObject on the source and s3:PutObject on the target",
	What: "the S3 action",
}

// denied returns err as a refusal that names the IAM action op needs, or
// nil when err is no refusal.
func denied(op string, err error) error {
	code := storage.ErrorCode(err)
	if code != "AccessDenied" && code != "AllAccessDisabled" && storage.HTTPStatus(err) != http.StatusForbidden {
		return nil
	}
	msg := fmt.Sprintf("access denied: the agent's role lacks %s on this bucket and prefix (see docs/iam.md)", actions.Of(op))
	return &storage.DeniedError{Msg: msg, Err: err}
}
