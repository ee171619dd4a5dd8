//go:build !linux

package probe

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"time"
)

// dialFast is false where dialIP is not implemented: probes dial through net.Dialer.
const dialFast = false

func dialIP(context.Context, netip.AddrPort, time.Time, int32) (*os.File, error) {
	return nil, errors.New("dialIP is implemented on Linux only")
}

func localAddr(int) net.Addr { return nil }
