package gs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"

	gcs "cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"

	"github.com/ckpt-io/ckpt/storage"
)

// OpenError is the one-line error New returns when the bucket cannot be
// used (see storage.OpenError).
type OpenError = storage.OpenError

// probe reads the bucket's metadata and explains a failure. A server that
// is down or refuses the request fails at once; an answer that says "try
// again" (5xx, 429, a reset connection) is asked again a few times within
// the probe timeout, so one transient fault does not stop an agent from
// starting.
func (s *Store) probe(ctx context.Context) error {
	return storage.Probe{
		Name:    fmt.Sprintf("gs bucket %q", s.name),
		Timeout: probeTimeout,
		Check: func(ctx context.Context) error {
			_, err := s.bucket.Retryer(gcs.WithPolicy(gcs.RetryNever)).Attrs(ctx)
			var ge *googleapi.Error
			if errors.As(err, &ge) {
				return &StatusError{Code: ge.Code, Err: err}
			}
			return err
		},
		Explain: func(_ context.Context, err error, timedOut bool) (string, error) {
			return s.explain(err, timedOut), err
		},
	}.Run(ctx)
}

func (s *Store) explain(err error, timedOut bool) string {
	b, ep := s.name, s.endpoint
	var dns *net.DNSError
	var ge *googleapi.Error
	switch {
	case errors.Is(err, gcs.ErrBucketNotExist):
		return fmt.Sprintf("gs bucket %q does not exist at endpoint %s (check the bucket name and STORAGE_EMULATOR_HOST)", b, ep)
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Sprintf("gs endpoint %s refused the connection for bucket %q (check STORAGE_EMULATOR_HOST and that the server is running)", ep, b)
	case errors.As(err, &dns):
		return fmt.Sprintf("gs endpoint %s for bucket %q: cannot resolve host %q (check STORAGE_EMULATOR_HOST and the network)", ep, b, dns.Name)
	case timedOut:
		return fmt.Sprintf("gs endpoint %s did not answer for bucket %q within %v (check the network and STORAGE_EMULATOR_HOST)", ep, b, probeTimeout)
	case errors.As(err, &ge) && (ge.Code == http.StatusForbidden || ge.Code == http.StatusUnauthorized):
		return fmt.Sprintf("gs bucket %q at endpoint %s: access denied, HTTP %d (check GOOGLE_APPLICATION_CREDENTIALS or the application-default login, and that the account may read the bucket)", b, ep, ge.Code)
	case errors.As(err, &ge):
		return fmt.Sprintf("gs bucket %q at endpoint %s: HTTP %d (check the bucket name and the endpoint)", b, ep, ge.Code)
	case strings.Contains(err.Error(), "credentials"):
		return fmt.Sprintf("gs bucket %q at endpoint %s: no usable Google credentials (set GOOGLE_APPLICATION_CREDENTIALS or run `gcloud auth application-default login`)", b, ep)
	}
	return fmt.Sprintf("gs endpoint %s for bucket %q: cannot connect: %v (check the network and STORAGE_EMULATOR_HOST)", ep, b, storage.RootCause(err))
}
