package s3

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ckpt-io/ckpt/storage"
)

// OpenError is the one-line error New returns when the bucket cannot be
// used (see storage.OpenError).
type OpenError = storage.OpenError

// probe sends a HeadBucket and explains a failure. A server that is down
// (connection refused, unknown host) or that refuses the request (4xx)
// fails at once, not after minutes of backoff; an answer that says "try
// again" (5xx, 429, a reset connection: S3 throttling, a flaky network) is
// asked again a few times within the probe timeout, so one transient fault
// does not stop an agent from starting.
func (s *Store) probe(ctx context.Context) error {
	return storage.Probe{
		Name:    fmt.Sprintf("s3 bucket %q", s.bucket),
		Timeout: probeTimeout,
		Check: func(ctx context.Context) error {
			_, err := s.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(s.bucket)}, once)
			return err
		},
		Explain: func(pctx context.Context, err error, timedOut bool) (string, error) {
			if c := storage.HTTPStatus(err); c >= 400 && c < 500 {
				// A HEAD answer has no body, hence no error code: some servers
				// answer 404 for an unknown access key. Ask once more with a GET
				// (same permission) to learn the code.
				_, lerr := s.client.ListObjectsV2(pctx, &s3.ListObjectsV2Input{Bucket: aws.String(s.bucket), MaxKeys: aws.Int32(1)}, once)
				if lerr != nil && storage.ErrorCode(lerr) != "" {
					err = lerr
				}
			}
			return s.explain(err, timedOut), err
		},
	}.Run(ctx)
}

func (s *Store) explain(err error, timedOut bool) string {
	b, ep := s.bucket, s.endpoint
	var dns *net.DNSError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Sprintf("s3 endpoint %s refused the connection for bucket %q (check AWS_ENDPOINT_URL or endpoint= and that the server is running)", ep, b)
	case errors.As(err, &dns):
		return fmt.Sprintf("s3 endpoint %s for bucket %q: cannot resolve host %q (check AWS_ENDPOINT_URL or endpoint=, AWS_REGION and the bucket name)", ep, b, dns.Name)
	case timedOut:
		return fmt.Sprintf("s3 endpoint %s did not answer for bucket %q within %v (check AWS_ENDPOINT_URL or endpoint=, and the network)", ep, b, probeTimeout)
	case strings.Contains(err.Error(), "get credentials") || strings.Contains(err.Error(), "retrieve credentials"):
		return fmt.Sprintf("no usable AWS credentials for s3 bucket %q at endpoint %s (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or a web identity token)", b, ep)
	}
	switch storage.ErrorCode(err) {
	case "NoSuchBucket":
		return fmt.Sprintf("s3 bucket %q does not exist at endpoint %s (check the bucket name, AWS_ENDPOINT_URL and AWS_REGION)", b, ep)
	case "InvalidAccessKeyId", "XAdminUserNotFound", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken", "TokenRefreshRequired":
		return fmt.Sprintf("s3 bucket %q at endpoint %s: access denied (%s; check the credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or AWS_PROFILE, and the bucket policy)", b, ep, storage.ErrorCode(err))
	case "PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException":
		return fmt.Sprintf("s3 bucket %q at endpoint %s is in another region (%s; set AWS_REGION or region= to the bucket's region)", b, ep, storage.ErrorCode(err))
	}
	switch code := storage.HTTPStatus(err); code {
	case http.StatusNotFound:
		return fmt.Sprintf("s3 bucket %q does not exist at endpoint %s (check the bucket name, AWS_ENDPOINT_URL and AWS_REGION)", b, ep)
	case http.StatusForbidden, http.StatusUnauthorized:
		return fmt.Sprintf("s3 bucket %q at endpoint %s: access denied (check the credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or AWS_PROFILE, and the bucket policy)", b, ep)
	case http.StatusMovedPermanently, http.StatusBadRequest:
		return fmt.Sprintf("s3 bucket %q at endpoint %s: HTTP %d, the bucket may be in another region (check AWS_REGION or region=, and path_style=true for S3-compatible servers)", b, ep, code)
	case 0:
		return fmt.Sprintf("s3 endpoint %s for bucket %q: cannot connect: %v (check AWS_ENDPOINT_URL or endpoint=)", ep, b, storage.RootCause(err))
	default:
		return fmt.Sprintf("s3 bucket %q at endpoint %s: HTTP %d (check that the endpoint is an S3 service and the bucket name)", b, ep, code)
	}
}
