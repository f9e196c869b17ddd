package testservers

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Client returns an S3 client for the server with its credentials, path
// style addressing and a single attempt per call (tests see failures
// as they are).
func (s *S3Server) Client() *s3.Client {
	o := s3.Options{
		Region:           s.Region,
		BaseEndpoint:     aws.String(s.Endpoint),
		UsePathStyle:     true,
		Credentials:      credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
		RetryMaxAttempts: 1,
	}
	if s.CAFile != "" {
		if pem, err := os.ReadFile(s.CAFile); err == nil {
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(pem)
			o.HTTPClient = awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
				tr.TLSClientConfig = &tls.Config{RootCAs: pool}
			})
		}
	}
	return s3.New(o)
}

func (s *S3Server) createBucket(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)})
	return err
}
