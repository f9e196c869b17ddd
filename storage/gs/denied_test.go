package gs

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/api/googleapi"
)

// A 403 names the IAM permission the operation needs, and is marked as a
// permission refusal; its status stays readable.
func TestA403NamesThePermission(t *testing.T) {
	s := &Store{name: "b"}
	for op, want := range map[string]string{"create": "storage.objects.create", "get": "storage.objects.get",
		"list": "storage.objects.list", "delete": "storage.objects.delete"} {
		err := s.wrap(op, "k", &googleapi.Error{Code: 403, Message: "forbidden"})
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s refused: %q does not name %s", op, err, want)
		}
		var pd interface{ PermissionDenied() bool }
		if !errors.As(err, &pd) || !pd.PermissionDenied() {
			t.Errorf("%s refused: %v is not marked as a permission refusal", op, err)
		}
		var st interface{ HTTPStatusCode() int }
		if !errors.As(err, &st) || st.HTTPStatusCode() != 403 {
			t.Errorf("%s refused: the status is lost: %v", op, err)
		}
	}
	if err := s.wrap("get", "k", &googleapi.Error{Code: 503}); strings.Contains(err.Error(), "permission denied") {
		t.Errorf("a 503 reads as permission denied: %v", err)
	}
}
