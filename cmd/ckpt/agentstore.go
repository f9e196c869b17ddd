package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/lazy"
)

// openAgentStore opens the agent's storage without making it a condition
// of starting: a bucket that does not answer, or refuses the agent's
// credentials, is an outage the agent rides out (checkpoints answer
// unavailable, ckpt_storage_up is 0, /healthz/storage says why) while it
// serves its socket, so the app starts and runs. A URL ckpt cannot use at
// all (bad syntax, unknown scheme, a file:// directory that does not
// exist) still stops it: that is a mistake to fix, not an outage.
func openAgentStore(ctx context.Context, rawURL string, log *slog.Logger) (storage.Store, error) {
	open := func(ctx context.Context) (storage.Store, error) { return openStore(ctx, rawURL) }
	s, err := open(ctx)
	var oe *storage.OpenError
	switch {
	case err == nil:
		return lazy.New(s.String(), s, nil, open, 0), nil
	case errors.As(err, &oe):
		log.Error("storage unavailable at start: serving the socket anyway; checkpoints answer unavailable until storage answers (see /healthz/storage)", "storage", rawURL, "err", err)
		return lazy.New(rawURL, nil, err, open, 0), nil
	}
	return nil, err
}
