//go:build !linux

package agent

import (
	"errors"
	"net"
)

// peerCred reads the credentials of a Unix connection's peer: SO_PEERCRED
// is Linux's, so elsewhere they are unknown (and --allow-uid/--allow-gid
// refuse every peer).
func peerCred(net.Conn) (Peer, error) {
	return Peer{}, errors.New("peer credentials are only read on Linux")
}
