package testservers_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"

	"github.com/ckpt-io/ckpt/lab/testservers"
)

func TestAzuriteStartsAndCreatesContainers(t *testing.T) {
	s := testservers.Azurite(t)
	if !strings.HasPrefix(s.Endpoint, "http://127.0.0.1:") || !strings.HasSuffix(s.Endpoint, "/"+testservers.AzuriteAccount) {
		t.Fatalf("endpoint %q", s.Endpoint)
	}
	s.CreateContainer(t, "ckpt")
	c, err := container.NewClientFromConnectionString(s.ConnectionString, "ckpt", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.GetProperties(ctx, nil); err != nil {
		t.Fatalf("container properties: %v", err)
	}
	if got := s.URL("ckpt", "/job/"); got != "az://ckpt/job" {
		t.Fatalf("URL = %q", got)
	}
}
