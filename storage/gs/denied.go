package gs

import (
	"fmt"
	"net/http"

	"github.com/ckpt-io/ckpt/storage"
)

// permissions names the IAM permission each operation of the store needs
// (the list docs/iam.md gives). A 403 names it, so that an operator fixes
// the role without guessing.
var permissions = storage.Needs{
	Ops: map[string]string{
		"put":    "storage.objects.create (and storage.objects.delete, to replace an object)",
		"create": "storage.objects.create",
		"get":    "storage.objects.get",
		"stat":   "storage.objects.get",
		"list":   "storage.objects.list",
		"delete": "storage.objects.delete",
	},
	Copy: "storage.objects.get on the source and storage.objects.create on the target",
	What: "the permission",
}

// denied returns err, answered with HTTP code, as a refusal that names
// the permission op needs, or nil when code is no refusal.
func denied(op string, code int, err error) error {
	if code != http.StatusForbidden {
		return nil
	}
	msg := fmt.Sprintf("permission denied: the agent's service account lacks %s on this bucket (see docs/iam.md)", permissions.Of(op))
	return &storage.DeniedError{Msg: msg, Err: err}
}
