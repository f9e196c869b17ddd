package testservers_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ckpt-io/ckpt/lab/testservers"
)

func TestS3ServerStartsWithCredentialsAndBuckets(t *testing.T) {
	srv := testservers.S3(t)
	srv.CreateBucket(t, "bucket-one")
	if _, err := os.Stat(filepath.Join(srv.DataDir, "bucket-one")); err != nil {
		t.Fatalf("bucket directory not in the data dir: %v", err)
	}
	ctx := context.Background()
	c := srv.Client()
	if _, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("bucket-one"), Key: aws.String("k"), Body: strings.NewReader("v")}); err != nil {
		t.Fatalf("put with the server's credentials: %v", err)
	}
	resp, err := http.Get(srv.Endpoint + "/bucket-one/k")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("an unsigned get answered %s, want 403: the server must check credentials", resp.Status)
	}
	env := strings.Join(srv.Env(), " ")
	for _, want := range []string{"AWS_ACCESS_KEY_ID=testkey", "AWS_SECRET_ACCESS_KEY=testsecret", "AWS_ENDPOINT_URL=" + srv.Endpoint} {
		if !strings.Contains(env, want) {
			t.Errorf("Env() = %v lacks %s", srv.Env(), want)
		}
	}
	if u := srv.URL("bucket-one", "/p/q/"); !strings.HasPrefix(u, "s3://bucket-one/p/q?") || !strings.Contains(u, "path_style=true") {
		t.Errorf("URL = %s", u)
	}
}

func TestGCSServerStartsAndCreatesBuckets(t *testing.T) {
	srv := testservers.GCS(t)
	srv.CreateBucket(t, "bucket-one")
	resp, err := http.Get(srv.Endpoint + "/storage/v1/b/bucket-one")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("bucket lookup: %s", resp.Status)
	}
	if got := srv.Env(); len(got) != 1 || got[0] != "STORAGE_EMULATOR_HOST="+srv.Host {
		t.Errorf("Env() = %v", got)
	}
	if u := srv.URL("bucket-one", "p"); u != "gs://bucket-one/p" {
		t.Errorf("URL = %s", u)
	}
}

func TestS3ServerWithTLS(t *testing.T) {
	srv := testservers.S3(t, testservers.WithTLS())
	if !strings.HasPrefix(srv.Endpoint, "https://127.0.0.1:") {
		t.Fatalf("endpoint %s is not HTTPS on loopback", srv.Endpoint)
	}
	if !strings.Contains(strings.Join(srv.Env(), " "), "AWS_CA_BUNDLE="+srv.CAFile) {
		t.Fatalf("Env() = %v lacks the CA bundle", srv.Env())
	}
	srv.CreateBucket(t, "tls-bucket") // through a client that trusts the test CA
	if _, err := http.Get(srv.Endpoint); err == nil {
		t.Fatal("a client without the test CA trusted the server")
	}
}
