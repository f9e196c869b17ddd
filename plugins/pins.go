package plugins

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Pins maps plugin names (the part of the file name after ckpt-plugin-)
// to the hex SHA-256 their binary must have. A pinned binary whose hash
// differs is refused before it runs, at discovery and at every restart
// (each start hashes the open file it then executes).
type Pins map[string]string

// ParsePin parses NAME=HEX: a plugin name (ckpt-plugin-NAME is accepted
// too) and 64 hex digits.
func ParsePin(s string) (name, sum string, err error) {
	name, sum, ok := strings.Cut(strings.TrimSpace(s), "=")
	if !ok {
		return "", "", fmt.Errorf("%q: want NAME=SHA256 (the plugin's name after %s, and the 64 hex digits sha256sum prints)", s, Prefix)
	}
	return checkPin(name, sum)
}

func checkPin(name, sum string) (string, string, error) {
	name = strings.TrimPrefix(strings.TrimSpace(name), Prefix)
	sum = strings.ToLower(strings.TrimSpace(sum))
	if !nameRE.MatchString(name) {
		return "", "", fmt.Errorf("plugin name %q: the name after %s must match %s", name, Prefix, nameRE)
	}
	if b, err := hex.DecodeString(sum); err != nil || len(b) != 32 {
		return "", "", fmt.Errorf("plugin %s: %q is not a SHA-256 (64 hex digits; sha256sum %s%s prints it)", name, sum, Prefix, name)
	}
	return name, sum, nil
}

// Add pins one plugin; pinning a name twice to different hashes is an
// error.
func (p Pins) Add(name, sum string) error {
	if old, dup := p[name]; dup && old != sum {
		return fmt.Errorf("plugin %s is pinned twice, to %s and to %s: keep one", name, old, sum)
	}
	p[name] = sum
	return nil
}

// ReadPinFile reads a file of pins: one per line, either NAME=HEX or the
// output of `sha256sum ckpt-plugin-*` (HEX, spaces, the binary's path).
// Empty lines and lines starting with # are skipped.
func ReadPinFile(path string) (Pins, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("plugin pin file: %w", err)
	}
	pins := Pins{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var name, sum string
		if f := strings.Fields(line); len(f) == 2 && !strings.Contains(line, "=") {
			// sha256sum: "HEX  path" (binary mode marks the path with '*').
			sum, name = f[0], filepath.Base(strings.TrimPrefix(f[1], "*"))
			if !strings.HasPrefix(name, Prefix) {
				err = fmt.Errorf("%q is not a %s* binary", f[1], Prefix)
			} else {
				name, sum, err = checkPin(name, sum)
			}
		} else {
			name, sum, err = ParsePin(line)
		}
		if err == nil {
			err = pins.Add(name, sum)
		}
		if err != nil {
			return nil, fmt.Errorf("plugin pin file %s line %d: %w", path, n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("plugin pin file %s: %w", path, err)
	}
	return pins, nil
}
