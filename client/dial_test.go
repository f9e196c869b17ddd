package client

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDialWaitsForASocketCreatedLate: an app that starts before its agent
// (or while it restarts) connects once the socket appears.
func TestDialWaitsForASocketCreatedLate(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "late.sock")
	listening := make(chan net.Listener, 1)
	timer := time.AfterFunc(300*time.Millisecond, func() {
		l, err := net.Listen("unix", sock)
		if err != nil {
			t.Error(err)
			close(listening)
			return
		}
		listening <- l
		c, err := l.Accept()
		if err == nil {
			c.Close()
		}
	})
	defer timer.Stop()
	c, err := Dial(ctxT(t), sock)
	if err != nil {
		t.Fatalf("dial a socket that appears after 300ms: %v", err)
	}
	c.Close()
	if l, ok := <-listening; ok {
		l.Close()
	}
}

// TestDialGivesUpWithAClearError: the wait is bounded by ctx and by the
// dial wait, and the error names the socket and what to check.
func TestDialGivesUpWithAClearError(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "never.sock")
	t.Run("the dial wait passes", func(t *testing.T) {
		_, err := Dial(ctxT(t), sock, WithDialWait(200*time.Millisecond))
		if err == nil || !strings.Contains(err.Error(), sock) || !strings.Contains(err.Error(), "of retries") || !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("ctx ends first", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err := Dial(ctx, sock)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), sock) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("no wait: one attempt", func(t *testing.T) {
		_, err := Dial(ctxT(t), sock, WithDialWait(0))
		if !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("err %v", err)
		}
	})
}
