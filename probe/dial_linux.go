//go:build linux

package probe

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dialFast is true where dialIP is implemented.
const dialFast = true

// dialIP connects a TCP socket to ap (an IP literal without zone) by deadline,
// the way net.Dialer does, without the net package's per-dial machinery: a
// non-blocking socket, connect, then a wait for writability on the runtime
// poller. The socket gets SO_LINGER with linger seconds (see setLinger), set
// before connecting as the kubelet's dialer Control does. ctx cancels the wait.
//
// Errors are the *net.OpError values net.Dialer returns, so messages match the
// kubelet's word for word: "dial tcp 10.0.0.1:80: connect: connection refused",
// "dial tcp 10.0.0.1:80: i/o timeout", "... operation was canceled".
func dialIP(ctx context.Context, ap netip.AddrPort, deadline time.Time, linger int32) (*os.File, error) {
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	if err := ctx.Err(); err != nil {
		return nil, dialError(ap, ctxDialError(err))
	}
	if !time.Now().Before(deadline) {
		return nil, dialError(ap, os.ErrDeadlineExceeded)
	}
	// As net's dialTCP: retry a connection to ourselves (a port in the
	// ephemeral range with no listener) and a spurious EADDRNOTAVAIL.
	var (
		f   *os.File
		err error
	)
	for i := 0; ; i++ {
		var retry bool
		f, retry, err = connectOnce(ctx, ap, deadline, linger, i < 2)
		if !retry || i == 2 {
			break
		}
	}
	if err != nil {
		return nil, dialError(ap, err)
	}
	return f, nil
}

// connectOnce makes one connection attempt. retry reports a self-connect (when
// checkSelf) or a spurious EADDRNOTAVAIL, after which net.Dialer tries again.
func connectOnce(ctx context.Context, ap netip.AddrPort, deadline time.Time, linger int32, checkSelf bool) (f *os.File, retry bool, err error) {
	family := unix.AF_INET6
	if ap.Addr().Is4() {
		family = unix.AF_INET
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, false, os.NewSyscallError("socket", err)
	}
	setLingerFd(fd, linger)
	switch err := rawConnect(fd, ap); err {
	case nil, unix.EISCONN:
		// Connected at once (loopback can do this).
	case unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
		f = os.NewFile(uintptr(fd), "")
		if werr := waitConnected(ctx, f, deadline); werr != nil {
			_ = f.Close()
			var errno syscall.Errno
			if errors.As(werr, &errno) && errno == unix.EADDRNOTAVAIL {
				return nil, true, werr
			}
			return nil, false, werr
		}
	default:
		_ = unix.Close(fd)
		return nil, err == unix.EADDRNOTAVAIL, os.NewSyscallError("connect", err)
	}
	if f == nil {
		f = os.NewFile(uintptr(fd), "")
	}
	if checkSelf && selfConnected(fd, ap) {
		_ = f.Close()
		return nil, true, os.NewSyscallError("connect", unix.ECONNREFUSED)
	}
	return f, false, nil
}

// connectState carries the result out of the RawConn callback.
type connectState struct {
	err error
}

// waitConnected waits on the runtime poller until the connect in progress on f
// finished, deadline passed or ctx ended.
func waitConnected(ctx context.Context, f *os.File, deadline time.Time) error {
	if err := f.SetWriteDeadline(deadline); err != nil {
		return err
	}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { _ = f.SetWriteDeadline(aLongTimeAgo) })
		defer stop()
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var st connectState
	werr := rc.Write(func(fd uintptr) bool {
		v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			st.err = os.NewSyscallError("getsockopt", err)
			return true
		}
		switch e := syscall.Errno(v); e {
		case unix.EINPROGRESS, unix.EALREADY, unix.EINTR:
			return false
		case unix.EISCONN:
			return true
		case 0:
			// The poller can wake spuriously: only a peer name proves the connection.
			return peerKnown(int(fd))
		default:
			st.err = os.NewSyscallError("connect", e)
			return true
		}
	})
	if werr != nil {
		if cerr := ctx.Err(); cerr != nil {
			return ctxDialError(cerr)
		}
		if errors.Is(werr, os.ErrDeadlineExceeded) {
			return os.ErrDeadlineExceeded
		}
		return werr
	}
	return st.err
}

// errCanceled is net's message for a dial cancelled through its context.
var errCanceled = canceledError{}

type canceledError struct{}

func (canceledError) Error() string        { return "operation was canceled" }
func (canceledError) Is(target error) bool { return target == context.Canceled }

// ctxDialError maps a context error as net.Dialer does.
func ctxDialError(err error) error {
	if errors.Is(err, context.Canceled) {
		return errCanceled
	}
	return os.ErrDeadlineExceeded
}

// dialError wraps err as net.Dialer's *net.OpError for a dial to ap.
func dialError(ap netip.AddrPort, err error) error {
	return &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(ap), Err: err}
}

// setLingerFd sets SO_LINGER on with linger seconds; a negative linger leaves
// the option alone. As with the kubelet's dialer, a failure is ignored.
func setLingerFd(fd int, linger int32) {
	if linger < 0 {
		return
	}
	l := unix.Linger{Onoff: 1, Linger: linger}
	_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &l)
}

// rawConnect calls connect(2) with the address on the stack, which unix.Connect
// (taking a Sockaddr interface) would move to the heap.
func rawConnect(fd int, ap netip.AddrPort) error {
	var (
		sa4 unix.RawSockaddrInet4
		sa6 unix.RawSockaddrInet6
		ptr unsafe.Pointer
		n   uintptr
	)
	port := ap.Port()
	if ap.Addr().Is4() {
		sa4.Family = unix.AF_INET
		p := (*[2]byte)(unsafe.Pointer(&sa4.Port))
		p[0], p[1] = byte(port>>8), byte(port)
		sa4.Addr = ap.Addr().As4()
		ptr, n = unsafe.Pointer(&sa4), unsafe.Sizeof(sa4)
	} else {
		sa6.Family = unix.AF_INET6
		p := (*[2]byte)(unsafe.Pointer(&sa6.Port))
		p[0], p[1] = byte(port>>8), byte(port)
		sa6.Addr = ap.Addr().As16()
		ptr, n = unsafe.Pointer(&sa6), unsafe.Sizeof(sa6)
	}
	_, _, e := unix.Syscall(unix.SYS_CONNECT, uintptr(fd), uintptr(ptr), n)
	if e != 0 {
		return e
	}
	return nil
}

// peerKnown reports whether fd has a peer, i.e. is connected.
func peerKnown(fd int) bool {
	var rsa unix.RawSockaddrAny
	l := uint32(unsafe.Sizeof(rsa))
	_, _, e := unix.RawSyscall(unix.SYS_GETPEERNAME, uintptr(fd), uintptr(unsafe.Pointer(&rsa)), uintptr(unsafe.Pointer(&l)))
	return e == 0
}

// selfConnected reports whether fd's local address is ap itself: a connect to
// a local ephemeral port with no listener can "succeed" that way.
func selfConnected(fd int, ap netip.AddrPort) bool {
	var rsa unix.RawSockaddrAny
	l := uint32(unsafe.Sizeof(rsa))
	_, _, e := unix.RawSyscall(unix.SYS_GETSOCKNAME, uintptr(fd), uintptr(unsafe.Pointer(&rsa)), uintptr(unsafe.Pointer(&l)))
	if e != 0 {
		return true // as net: an unknown local address counts as self
	}
	port := ap.Port()
	switch rsa.Addr.Family {
	case unix.AF_INET:
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&rsa))
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		return uint16(p[0])<<8|uint16(p[1]) == port && ap.Addr().Is4() && sa.Addr == ap.Addr().As4()
	case unix.AF_INET6:
		sa := (*unix.RawSockaddrInet6)(unsafe.Pointer(&rsa))
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		return uint16(p[0])<<8|uint16(p[1]) == port && sa.Addr == ap.Addr().As16()
	}
	return false
}

// localAddr is fd's local address, or nil.
func localAddr(fd int) net.Addr {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return nil
	}
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return &net.TCPAddr{IP: net.IP(sa.Addr[:]).To16(), Port: sa.Port}
	case *unix.SockaddrInet6:
		return &net.TCPAddr{IP: net.IP(sa.Addr[:]), Port: sa.Port}
	}
	return nil
}
