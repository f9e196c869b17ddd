package main

import (
	"context"
	"fmt"
	"runtime/debug"
)

// version, commit and date are stamped at build time by deploy/build.sh
// (-ldflags "-X main.version=... -X main.commit=... -X main.date=...").
// What is not stamped comes from the build info the Go toolchain recorded
// (see readBuildInfo).
var version, commit, date string

// buildInfo is what `ckpt version --json` prints.
type buildInfo struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
	Date    string `json:"date"`
}

// readBuildInfo returns the version, commit and date of this binary: each
// stamped value, else the build info: the module version (a tagged `go
// install`) or "dev-" and the short revision, vcs.revision (with "-dirty"
// when the tree was modified) and vcs.time. What neither knows is
// "unknown" (commit, date) or "dev" (version).
func readBuildInfo() buildInfo {
	bi, _ := debug.ReadBuildInfo()
	return resolveBuildInfo(buildInfo{Version: version, Commit: commit, Date: date}, bi)
}

// resolveBuildInfo fills what stamped lacks from bi (nil: none).
func resolveBuildInfo(stamped buildInfo, bi *debug.BuildInfo) buildInfo {
	b := stamped
	var rev, modified, vcsTime, modVersion string
	if bi != nil {
		modVersion = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			case "vcs.time":
				vcsTime = s.Value
			}
		}
	}
	dirty := ""
	if modified == "true" {
		dirty = "-dirty"
	}
	if b.Commit == "" {
		b.Commit = "unknown"
		if rev != "" {
			b.Commit = rev + dirty
		}
	}
	if b.Date == "" {
		b.Date = "unknown"
		if vcsTime != "" {
			b.Date = vcsTime
		}
	}
	if b.Version == "" {
		switch {
		case modVersion != "" && modVersion != "(devel)":
			b.Version = modVersion
		case rev != "":
			short := rev
			if len(short) > 12 {
				short = short[:12]
			}
			b.Version = "dev-" + short + dirty
		default:
			b.Version = "dev"
		}
	}
	return b
}

// buildVersion is the version this binary reports (readBuildInfo's).
func buildVersion() string { return readBuildInfo().Version }

func runVersion(_ context.Context, args []string) error {
	fs := newFlags("version", "[--json]", "ckpt version --json")
	asJSON := fs.Bool("json", false, `print {"version","commit","date"} as JSON`)
	if err := parse(fs, args); err != nil {
		return err
	}
	b := readBuildInfo()
	if *asJSON {
		return printJSON(b)
	}
	fmt.Println(b.Version)
	return nil
}
