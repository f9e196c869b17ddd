// Command ckpt-plugin-s3 serves ckpt's built-in S3 backend from a plugin
// process, for the schemes s3 (hosts built without it) and s3+plugin (to
// route a ckpt that has it through the plugin anyway). URLs, environment
// and credentials are those of s3:// (see package storage/s3); the plugin
// inherits the host's environment.
package main

import (
	"context"
	"net/url"

	"github.com/ckpt-io/ckpt/plugins/sdk"
	"github.com/ckpt-io/ckpt/storage"
	"github.com/ckpt-io/ckpt/storage/s3"
)

func main() {
	sdk.ServeStorage(func(ctx context.Context, u *url.URL) (storage.Store, error) {
		c := *u
		c.Scheme = "s3"
		o, err := s3.ParseURL(&c)
		if err != nil {
			return nil, err
		}
		return s3.New(ctx, o)
	}, "s3", "s3+plugin")
}
