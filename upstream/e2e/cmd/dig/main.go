// Command dig is a stand-in for the two DNS tools upstream's DNS conformance tests run
// inside their probe pods: BIND's dig (from the agnhost and glibc-dns-testing images) and
// glibc's getent. No registry is reachable, so those images are rebuilt locally on the
// project's busybox, which has neither tool.
//
// As dig it takes the forms the tests use:
//
//	dig [+notcp|+tcp] [+noall] [+answer] [+search] [+short] NAME [A|AAAA|SRV|PTR|CNAME]
//
// and asks the first nameserver of /etc/resolv.conf over UDP (the default, +notcp) or TCP
// (+tcp), never /etc/hosts. With +search the name goes through resolv.conf's search list
// and ndots, as in dig; without it the name is asked as given. It prints the answer
// section, one record per line, in dig's "name ttl class type data" form or, with +short,
// the data alone. A name that does not exist prints nothing and exits 0, as dig does; a
// server that cannot be reached exits 9. Messages are built and read with
// golang.org/x/net/dns/dnsmessage (already in the module graph) rather than by hand.
//
// Invoked as getent (a hard link), it answers `getent hosts NAME` from /etc/hosts and then
// DNS, printing "ADDRESS NAME" lines, and exits 2 when the name is unknown.
//
// getent resolves with Go's resolver and dig is a Go program, not glibc or musl: the DNS
// specs that compare the two libcs' behaviour test this program twice.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var code int
	if filepath.Base(os.Args[0]) == "getent" {
		code = getent(ctx, os.Args[1:])
	} else {
		code = dig(ctx, os.Args[1:])
	}
	os.Exit(code)
}

func getent(ctx context.Context, args []string) int {
	if len(args) != 2 || args[0] != "hosts" {
		fmt.Fprintln(os.Stderr, "usage: getent hosts NAME")
		return 1
	}
	addrs, err := net.DefaultResolver.LookupHost(ctx, args[1])
	if err != nil || len(addrs) == 0 {
		return 2
	}
	for _, a := range addrs {
		fmt.Printf("%-15s %s\n", a, args[1])
	}
	return 0
}

type query struct {
	name, rtype     string
	tcp, search     bool
	short, noanswer bool
}

func parse(args []string) (query, error) {
	q := query{rtype: "A"}
	var rest []string
	for _, a := range args {
		switch a {
		case "+tcp", "+vc":
			q.tcp = true
		case "+notcp", "+novc":
			q.tcp = false
		case "+search":
			q.search = true
		case "+nosearch":
			q.search = false
		case "+short":
			q.short = true
		case "+noall":
			q.noanswer = true
		case "+answer":
			q.noanswer = false
		default:
			if strings.HasPrefix(a, "+") || strings.HasPrefix(a, "-") {
				return q, fmt.Errorf("dig: option %q is not supported by this stand-in", a)
			}
			rest = append(rest, a)
		}
	}
	switch len(rest) {
	case 2:
		q.rtype = strings.ToUpper(rest[1])
		fallthrough
	case 1:
		q.name = rest[0]
		if _, ok := types[q.rtype]; !ok {
			return q, fmt.Errorf("dig: record type %q is not supported by this stand-in", q.rtype)
		}
	default:
		return q, errors.New("usage: dig [+notcp|+tcp] [+noall] [+answer] [+search] [+short] NAME [A|AAAA|SRV|PTR|CNAME]")
	}
	return q, nil
}

func dig(ctx context.Context, args []string) int {
	q, err := parse(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	conf, err := readResolvConf("/etc/resolv.conf")
	if err != nil {
		fmt.Fprintf(os.Stderr, ";; %v\n", err)
		return 9
	}
	qtype, ok := types[q.rtype]
	if !ok {
		fmt.Fprintf(os.Stderr, "dig: record type %q is not supported by this stand-in\n", q.rtype)
		return 1
	}
	for _, name := range conf.candidates(q.name, q.search) {
		answers, rcode, err := exchange(ctx, conf.server, name, qtype, q.tcp)
		if err != nil {
			fmt.Fprintf(os.Stderr, ";; %v\n", err)
			return 9
		}
		if rcode != dnsmessage.RCodeSuccess || len(answers) == 0 {
			continue // NXDOMAIN or no data: dig +search moves on to the next name
		}
		if q.noanswer && !q.short {
			return 0
		}
		for _, rr := range answers {
			data := rdata(rr)
			if q.short {
				fmt.Println(data)
			} else {
				fmt.Printf("%s\t%d\tIN\t%s\t%s\n", rr.Header.Name, rr.Header.TTL, strings.TrimPrefix(rr.Header.Type.String(), "Type"), data)
			}
		}
		return 0
	}
	return 0
}

var types = map[string]dnsmessage.Type{
	"A": dnsmessage.TypeA, "AAAA": dnsmessage.TypeAAAA, "SRV": dnsmessage.TypeSRV,
	"PTR": dnsmessage.TypePTR, "CNAME": dnsmessage.TypeCNAME, "TXT": dnsmessage.TypeTXT,
}

type resolvConf struct {
	server string
	search []string
	ndots  int
}

func readResolvConf(path string) (resolvConf, error) {
	c := resolvConf{ndots: 1}
	b, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "nameserver":
			if c.server == "" {
				c.server = net.JoinHostPort(f[1], "53")
			}
		case "search", "domain":
			c.search = f[1:]
		case "options":
			for _, o := range f[1:] {
				if v, ok := strings.CutPrefix(o, "ndots:"); ok {
					if n, err := strconv.Atoi(v); err == nil {
						c.ndots = n
					}
				}
			}
		}
	}
	if c.server == "" {
		return c, fmt.Errorf("no nameserver in %s", path)
	}
	return c, nil
}

// candidates lists the names dig asks, in order: the name as given when it is absolute or
// +search is off; else the search list first when it has fewer dots than ndots, and the
// name itself first otherwise (resolv.conf(5)).
func (c resolvConf) candidates(name string, search bool) []string {
	if strings.HasSuffix(name, ".") {
		return []string{name}
	}
	if !search {
		return []string{name + "."}
	}
	var searched []string
	for _, d := range c.search {
		searched = append(searched, name+"."+strings.TrimSuffix(d, ".")+".")
	}
	if strings.Count(name, ".") >= c.ndots {
		return append([]string{name + "."}, searched...)
	}
	return append(searched, name+".")
}

// exchange asks server one question over UDP or TCP and returns the answer section.
// A truncated UDP answer is asked again over TCP, as dig does.
func exchange(ctx context.Context, server, name string, qtype dnsmessage.Type, tcp bool) ([]dnsmessage.Resource, dnsmessage.RCode, error) {
	qname, err := dnsmessage.NewName(name)
	if err != nil {
		return nil, 0, fmt.Errorf("bad name %q: %w", name, err)
	}
	id := uint16(time.Now().UnixNano())
	msg := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: id, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: qname, Type: qtype, Class: dnsmessage.ClassINET}},
	}
	packed, err := msg.Pack()
	if err != nil {
		return nil, 0, err
	}
	network := "udp"
	if tcp {
		network = "tcp"
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, server)
	if err != nil {
		return nil, 0, fmt.Errorf("connection to %s failed: %w", server, err)
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	var reply []byte
	if tcp {
		framed := append([]byte{byte(len(packed) >> 8), byte(len(packed))}, packed...)
		if _, err := conn.Write(framed); err != nil {
			return nil, 0, err
		}
		var size [2]byte
		if _, err := io.ReadFull(conn, size[:]); err != nil {
			return nil, 0, fmt.Errorf("reading from %s: %w", server, err)
		}
		reply = make([]byte, int(size[0])<<8|int(size[1]))
		if _, err := io.ReadFull(conn, reply); err != nil {
			return nil, 0, fmt.Errorf("reading from %s: %w", server, err)
		}
	} else {
		if _, err := conn.Write(packed); err != nil {
			return nil, 0, err
		}
		buf := make([]byte, 65535)
		n, err := conn.Read(buf)
		if err != nil {
			return nil, 0, fmt.Errorf("reading from %s: %w", server, err)
		}
		reply = buf[:n]
	}
	var resp dnsmessage.Message
	if err := resp.Unpack(reply); err != nil {
		return nil, 0, fmt.Errorf("bad reply from %s: %w", server, err)
	}
	if resp.Header.ID != id {
		return nil, 0, fmt.Errorf("reply from %s answers another query", server)
	}
	if resp.Header.Truncated && !tcp {
		return exchange(ctx, server, name, qtype, true)
	}
	return resp.Answers, resp.Header.RCode, nil
}

// rdata prints a record's data as dig +short does.
func rdata(rr dnsmessage.Resource) string {
	switch b := rr.Body.(type) {
	case *dnsmessage.AResource:
		return net.IP(b.A[:]).String()
	case *dnsmessage.AAAAResource:
		return net.IP(b.AAAA[:]).String()
	case *dnsmessage.CNAMEResource:
		return b.CNAME.String()
	case *dnsmessage.PTRResource:
		return b.PTR.String()
	case *dnsmessage.SRVResource:
		return fmt.Sprintf("%d %d %d %s", b.Priority, b.Weight, b.Port, b.Target.String())
	case *dnsmessage.TXTResource:
		quoted := make([]string, len(b.TXT))
		for i, t := range b.TXT {
			quoted[i] = strconv.Quote(t)
		}
		return strings.Join(quoted, " ")
	default:
		return rr.Body.GoString()
	}
}
