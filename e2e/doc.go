// Package e2e holds the end-to-end tests of ckpt: they build the ckpt
// binary once, run the agent as a separate process, drive it over its Unix
// socket, through the client package and through the CLI, and check every
// outcome against the storage directory itself, not only against what the
// agent reports.
package e2e
