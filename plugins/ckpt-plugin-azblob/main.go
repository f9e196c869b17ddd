// Command ckpt-plugin-azblob serves Azure Blob Storage to ckpt as the
// storage scheme az (az://container/prefix). Credentials come from
// AZURE_STORAGE_CONNECTION_STRING or the Azure identity chain (see package
// azstore); the plugin inherits the host's environment. The ckpt binary
// does not link the Azure SDK: only this plugin does.
package main

import (
	"context"
	"net/url"

	"github.com/ckpt-io/ckpt/plugins/ckpt-plugin-azblob/azstore"
	"github.com/ckpt-io/ckpt/plugins/sdk"
	"github.com/ckpt-io/ckpt/storage"
)

func main() {
	sdk.ServeStorage(func(ctx context.Context, u *url.URL) (storage.Store, error) {
		o, err := azstore.ParseURLEnv(u)
		if err != nil {
			return nil, err
		}
		return azstore.New(ctx, o)
	}, "az")
}
