// Command nc is a stand-in for OpenBSD netcat (Alpine's netcat-openbsd) in the agnhost
// images upstream's conformance tests exec into: the Service reachability checks run
// `echo hostName | nc -v -t -w 2 HOST PORT` (and -u for UDP) and busybox's own nc, which
// the locally built image would otherwise have, refuses -v, -t and -u.
//
// It takes netcat-openbsd's options that the v1.37.2 e2e tests use, with its meaning:
//
//	nc [-46lNtuUvz] [-p PORT] [-s ADDR] [-w SECONDS] [HOST] [PORT]
//
// As a client it connects (TCP by default, UDP with -u, a unix socket with -U), copies
// standard input to the connection and the connection to standard output, and ends when
// the peer closes or, with -w, when neither side has said anything for that long (-w also
// bounds the connect). Standard input's end does not end it (it shuts the write side down
// only with -N), as in netcat-openbsd. -z connects and closes at once. -l listens for one
// connection (or datagram sender) instead. -v reports on standard error in
// netcat-openbsd's words ("Connection to HOST PORT port [tcp/*] succeeded!", "nc: connect
// to HOST port PORT (tcp) failed: ..."). It exits 0 on success and 1 on a failure.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

type options struct {
	listen, udp, unix, verbose, zero, shutdownOnEOF bool
	family                                          string // "", "4" or "6"
	port, source                                    string
	timeout                                         time.Duration
	host, hostPort                                  string
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	o, err := parse(args)
	if err != nil {
		fmt.Fprintf(stderr, "nc: %v\n", err)
		fmt.Fprintln(stderr, "usage: nc [-46lNtuUvz] [-p port] [-s source] [-w timeout] [destination] [port]")
		return 1
	}
	if o.listen {
		err = serve(o, stdin, stdout, stderr)
	} else {
		err = dial(o, stdin, stdout, stderr)
	}
	if err != nil {
		fmt.Fprintf(stderr, "nc: %v\n", err)
		return 1
	}
	return 0
}

func parse(args []string) (*options, error) {
	o := &options{}
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if len(a) < 2 || a[0] != '-' {
			rest = append(rest, a)
			continue
		}
		for j := 1; j < len(a); j++ {
			c := a[j]
			value := func() (string, error) {
				if j+1 < len(a) {
					v := a[j+1:]
					j = len(a)
					return v, nil
				}
				if i+1 >= len(args) {
					return "", fmt.Errorf("option requires an argument -- '%c'", c)
				}
				i++
				return args[i], nil
			}
			switch c {
			case 'l':
				o.listen = true
			case 'u':
				o.udp = true
			case 't':
				o.udp = false
			case 'U':
				o.unix = true
			case 'v':
				o.verbose = true
			case 'z':
				o.zero = true
			case 'N':
				o.shutdownOnEOF = true
			case 'n':
			case '4', '6':
				o.family = string(c)
			case 'p', 's', 'w':
				v, err := value()
				if err != nil {
					return nil, err
				}
				switch c {
				case 'p':
					o.port = v
				case 's':
					o.source = v
				case 'w':
					n, err := strconv.Atoi(v)
					if err != nil || n < 0 {
						return nil, fmt.Errorf("timeout invalid: %s", v)
					}
					o.timeout = time.Duration(n) * time.Second
				}
			default:
				return nil, fmt.Errorf("invalid option -- '%c'", c)
			}
		}
	}
	switch {
	case o.unix:
		if len(rest) != 1 {
			return nil, errors.New("a unix socket needs exactly one path")
		}
		o.host = rest[0]
	case o.listen:
		// nc -l PORT, nc -l -p PORT, nc -l ADDR PORT.
		switch len(rest) {
		case 0:
		case 1:
			o.port = rest[0]
		case 2:
			o.host, o.port = rest[0], rest[1]
		default:
			return nil, errors.New("too many arguments")
		}
		if o.port == "" {
			return nil, errors.New("missing port number")
		}
	default:
		if len(rest) != 2 {
			return nil, errors.New("missing hostname and port")
		}
		o.host, o.port = rest[0], rest[1]
	}
	if !o.unix {
		if _, err := strconv.ParseUint(o.port, 10, 16); err != nil {
			return nil, fmt.Errorf("port number invalid: %s", o.port)
		}
		o.hostPort = net.JoinHostPort(o.host, o.port)
	}
	return o, nil
}

func (o *options) network() string {
	switch {
	case o.unix:
		return "unix"
	case o.udp:
		return "udp" + o.family
	default:
		return "tcp" + o.family
	}
}

func (o *options) proto() string {
	if o.udp {
		return "udp"
	}
	return "tcp"
}

func dial(o *options, stdin io.Reader, stdout, stderr io.Writer) error {
	d := net.Dialer{Timeout: o.timeout}
	if o.source != "" {
		ip := net.ParseIP(o.source)
		if ip == nil {
			return fmt.Errorf("invalid source address: %s", o.source)
		}
		if o.udp {
			d.LocalAddr = &net.UDPAddr{IP: ip}
		} else {
			d.LocalAddr = &net.TCPAddr{IP: ip}
		}
	}
	addr := o.hostPort
	if o.unix {
		addr = o.host
	}
	conn, err := d.DialContext(context.Background(), o.network(), addr)
	if err != nil {
		if o.unix {
			return fmt.Errorf("unix connect failed: %v", unwrap(err))
		}
		return fmt.Errorf("connect to %s port %s (%s) failed: %v", o.host, o.port, o.proto(), unwrap(err))
	}
	defer conn.Close()
	if o.verbose {
		if o.unix {
			fmt.Fprintf(stderr, "Connection to %s succeeded!\n", o.host)
		} else {
			fmt.Fprintf(stderr, "Connection to %s %s port [%s/*] succeeded!\n", o.host, o.port, o.proto())
		}
	}
	if o.zero {
		return nil
	}
	return pump(o, conn, stdin, stdout)
}

// unwrap drops net.OpError's "dial tcp ...:" prefix, as netcat prints only the cause.
func unwrap(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		if se, ok := op.Err.(*os.SyscallError); ok {
			return errors.New(capitalize(se.Err.Error()))
		}
		if op.Timeout() {
			//lint:ignore ST1005 netcat's own words
			return errors.New("Operation timed out")
		}
		return op.Err
	}
	return err
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// pump copies stdin to conn and conn to stdout until the peer closes or, with a
// timeout, both sides have been idle that long.
func pump(o *options, conn net.Conn, stdin io.Reader, stdout io.Writer) error {
	var mu sync.Mutex
	last := time.Now()
	touch := func() { mu.Lock(); last = time.Now(); mu.Unlock() }
	idleFor := func() time.Duration { mu.Lock(); defer mu.Unlock(); return time.Since(last) }

	go func() {
		buf := make([]byte, 32*1024)
		for {
			n, err := stdin.Read(buf)
			if n > 0 {
				touch()
				if _, werr := conn.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				if o.shutdownOnEOF {
					if cw, ok := conn.(interface{ CloseWrite() error }); ok {
						_ = cw.CloseWrite()
					}
				}
				return
			}
		}
	}()
	buf := make([]byte, 64*1024)
	for {
		if o.timeout > 0 {
			_ = conn.SetReadDeadline(time.Now().Add(o.timeout))
		}
		n, err := conn.Read(buf)
		if n > 0 {
			touch()
			if _, werr := stdout.Write(buf[:n]); werr != nil {
				return nil
			}
		}
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			if idleFor() >= o.timeout {
				return nil
			}
			continue
		}
		// The peer closed, or (UDP) nothing listens: netcat ends quietly either way.
		return nil
	}
}

func serve(o *options, stdin io.Reader, stdout, stderr io.Writer) error {
	if o.udp {
		pc, err := net.ListenPacket(o.network(), o.hostPort)
		if err != nil {
			return err
		}
		defer pc.Close()
		if o.verbose {
			fmt.Fprintf(stderr, "Bound on %s %s\n", o.hostOr("0.0.0.0"), o.port)
		}
		buf := make([]byte, 64*1024)
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return err
		}
		_, _ = stdout.Write(buf[:n])
		conn, err := net.DialUDP(o.network(), nil, from.(*net.UDPAddr))
		if err != nil {
			return err
		}
		defer conn.Close()
		return pump(o, conn, stdin, stdout)
	}
	addr := o.hostPort
	if o.unix {
		addr = o.host
	}
	l, err := net.Listen(o.network(), addr)
	if err != nil {
		return err
	}
	defer l.Close()
	if o.verbose {
		if o.unix {
			fmt.Fprintf(stderr, "Bound on %s\n", o.host)
		} else {
			fmt.Fprintf(stderr, "Listening on %s %s\n", o.hostOr("0.0.0.0"), o.port)
		}
	}
	conn, err := l.Accept()
	if err != nil {
		return err
	}
	defer conn.Close()
	if o.verbose {
		fmt.Fprintf(stderr, "Connection received on %s\n", conn.RemoteAddr())
	}
	return pump(o, conn, stdin, stdout)
}

func (o *options) hostOr(def string) string {
	if o.host != "" {
		return o.host
	}
	return def
}
