package gs

import (
	"fmt"
	"net/http"
	"strings"
)

// permissions names the IAM permission each operation of the store needs
// (the list docs/iam.md gives). A 403 names it, so that an operator fixes
// the role without guessing.
var permissions = map[string]string{
	"put":    "storage.objects.create (and storage.objects.delete, to replace an object)",
	"create": "storage.objects.create",
	"get":    "storage.objects.get",
	"stat":   "storage.objects.get",
	"list":   "storage.objects.list",
	"delete": "storage.objects.delete",
}

// deniedPermission returns the permission a refused op needs, or "" when
// code is no refusal.
func deniedPermission(op string, code int) string {
	if code != http.StatusForbidden {
		return ""
	}
	if p, ok := permissions[op]; ok {
		return p
	}
	if strings.HasPrefix(op, "copy from") {
		return "storage.objects.get on the source and storage.objects.create on the target"
	}
	return "the permission of " + op
}

// deniedError says which permission a refused request needs.
type deniedError struct {
	permission string
	err        error
}

func (e *deniedError) Error() string {
	return fmt.Sprintf("permission denied: the agent's service account lacks %s on this bucket (see docs/iam.md): %v", e.permission, e.err)
}
func (e *deniedError) Unwrap() error { return e.err }

// PermissionDenied marks the error as a refusal of the caller's
// permissions (the agent shows the task blocked).
func (e *deniedError) PermissionDenied() bool { return true }
