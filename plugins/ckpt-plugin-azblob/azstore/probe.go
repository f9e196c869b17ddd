package azstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"

	"github.com/ckpt-io/ckpt/storage"
)

const probeTimeout = 30 * time.Second

// probe reads the container's properties and explains a failure. A server
// that is down or refuses the request fails at once; an answer that says
// "try again" (5xx, 429, a reset connection) is asked again a few times
// within the probe timeout.
func (s *Store) probe(ctx context.Context) error {
	return storage.Probe{
		Name:    fmt.Sprintf("az container %q", s.name),
		Timeout: probeTimeout,
		Check: func(ctx context.Context) error {
			_, err := s.client.GetProperties(policy.WithRetryOptions(ctx, policy.RetryOptions{MaxRetries: -1}), nil)
			return classify(err)
		},
		Explain: func(_ context.Context, err error, timedOut bool) (string, error) {
			return s.explain(err, timedOut), err
		},
	}.Run(ctx)
}

func (s *Store) explain(err error, timedOut bool) string {
	c, ep := s.name, s.endpoint
	var dns *net.DNSError
	var re *azcore.ResponseError
	var authErr *azidentity.AuthenticationFailedError
	switch {
	case bloberror.HasCode(err, bloberror.ContainerNotFound):
		return fmt.Sprintf("az container %q does not exist at %s (check the container name and the account in AZURE_STORAGE_CONNECTION_STRING)", c, ep)
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Sprintf("az endpoint %s refused the connection for container %q (check the BlobEndpoint in AZURE_STORAGE_CONNECTION_STRING and that the server is running)", ep, c)
	case errors.As(err, &dns):
		return fmt.Sprintf("az endpoint %s for container %q: cannot resolve host %q (check the account name and the network)", ep, c, dns.Name)
	case errors.As(err, &authErr) || strings.Contains(err.Error(), "Credential"):
		return fmt.Sprintf("az container %q at %s: no usable Azure credentials (set AZURE_STORAGE_CONNECTION_STRING, or sign in for the identity chain: AZURE_CLIENT_ID/AZURE_TENANT_ID/..., managed identity or `az login`): %s", c, ep, storage.RootCause(err))
	case timedOut:
		return fmt.Sprintf("az endpoint %s did not answer for container %q within %v (check the network and the endpoint)", ep, c, probeTimeout)
	case errors.As(err, &re) && (re.StatusCode == http.StatusForbidden || re.StatusCode == http.StatusUnauthorized):
		return fmt.Sprintf("az container %q at %s: access denied, HTTP %d %s (check the account key in AZURE_STORAGE_CONNECTION_STRING, or that the identity may read the container)", c, ep, re.StatusCode, re.ErrorCode)
	case errors.As(err, &re):
		return fmt.Sprintf("az container %q at %s: HTTP %d %s (check the container name and the endpoint)", c, ep, re.StatusCode, re.ErrorCode)
	}
	return fmt.Sprintf("az endpoint %s for container %q: cannot connect: %s (check the network and the endpoint)", ep, c, storage.RootCause(err))
}
