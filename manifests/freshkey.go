package manifests

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
)

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// freshSuffixLen is the length of the random suffix of a fresh key.
const freshSuffixLen = 16

// FreshKey returns key with a random suffix: a new object for bytes whose
// usual key is marked for deletion. Manifests accept it for their files
// (see Validate); GC treats it as any other object.
func FreshKey(key string) string { return key + "." + randomHex(freshSuffixLen/2) }

// isKeyOrFresh reports whether key is want or FreshKey(want).
func isKeyOrFresh(key, want string) bool {
	if key == want {
		return true
	}
	rest, ok := strings.CutPrefix(key, want+".")
	return ok && len(rest) == freshSuffixLen && validHex(rest)
}

func validHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}
