// Command curl is a stand-in for curl in the agnhost images upstream's conformance tests
// exec into (the real image is Alpine with curl installed; no registry is reachable, so
// the image is rebuilt locally on the project's busybox, which has no curl).
//
// It speaks HTTP/1.1 (and https with -k) through Go's net/http and takes the options the
// v1.37.2 e2e tests pass, in curl's syntax, including combined short options (-sIk):
//
//	-s --silent, -S --show-error, -q (ignored, as curl does when it comes first),
//	-g --globoff (no globbing is ever done), -i --include, -I --head, -k --insecure,
//	-v --verbose, -L --location, -f --fail, -o --output FILE, -w --write-out FORMAT,
//	-X --request METHOD, -H --header LINE, -d --data DATA, -m --max-time SECONDS,
//	--connect-timeout SECONDS, --interface ADDRESS
//
// -w knows %{http_code}, %{time_total}, %{time_connect}, %{remote_ip} and \n. Exit codes
// are curl's for the failures the tests tell apart: 3 bad URL, 6 cannot resolve, 7 cannot
// connect, 22 an HTTP error with --fail, 23 cannot write, 28 timed out, 35 TLS handshake,
// 52 empty reply, 56 receive failure, 2 an option it does not know.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// options are the parsed command line.
type options struct {
	silent, showError, include, head, insecure, verbose, location, fail bool
	output, writeOut, method, data, iface                               string
	headers                                                             []string
	maxTime, connectTimeout                                             time.Duration
	url                                                                 string
}

// curlError carries curl's exit code and message.
type curlError struct {
	code int
	msg  string
}

func (e *curlError) Error() string { return fmt.Sprintf("curl: (%d) %s", e.code, e.msg) }

func fail(code int, format string, args ...any) *curlError {
	return &curlError{code: code, msg: fmt.Sprintf(format, args...)}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parse(args)
	if err == nil {
		err = fetch(context.Background(), o, stdout, stderr)
	}
	var ce *curlError
	if errors.As(err, &ce) {
		if !o.silent || o.showError {
			fmt.Fprintln(stderr, ce.Error())
		}
		return ce.code
	}
	if err != nil {
		fmt.Fprintln(stderr, "curl:", err)
		return 1
	}
	return 0
}

// seconds reads curl's fractional-seconds option value.
func seconds(name, v string) (time.Duration, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 {
		return 0, fail(2, "option %s: expected a proper numerical parameter", name)
	}
	return time.Duration(f * float64(time.Second)), nil
}

func parse(args []string) (*options, error) {
	o := &options{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		next := func(name string) (string, error) {
			if i+1 >= len(args) {
				return "", fail(2, "option %s: requires parameter", name)
			}
			i++
			return args[i], nil
		}
		if strings.HasPrefix(a, "--") {
			name, val, hasVal := strings.Cut(a, "=")
			get := func() (string, error) {
				if hasVal {
					return val, nil
				}
				return next(name)
			}
			var err error
			switch name {
			case "--silent":
				o.silent = true
			case "--show-error":
				o.showError = true
			case "--globoff":
			case "--include":
				o.include = true
			case "--head":
				o.head = true
			case "--insecure":
				o.insecure = true
			case "--verbose":
				o.verbose = true
			case "--location":
				o.location = true
			case "--fail":
				o.fail = true
			case "--output":
				o.output, err = get()
			case "--write-out":
				o.writeOut, err = get()
			case "--request":
				o.method, err = get()
			case "--data", "--data-raw", "--data-binary":
				o.data, err = get()
			case "--header":
				var h string
				h, err = get()
				o.headers = append(o.headers, h)
			case "--interface":
				o.iface, err = get()
			case "--max-time", "--connect-timeout":
				var v string
				if v, err = get(); err == nil {
					var d time.Duration
					if d, err = seconds(name, v); err == nil {
						if name == "--max-time" {
							o.maxTime = d
						} else {
							o.connectTimeout = d
						}
					}
				}
			default:
				return o, fail(2, "option %s: is unknown", name)
			}
			if err != nil {
				return o, err
			}
			continue
		}
		if len(a) > 1 && a[0] == '-' {
			for j := 1; j < len(a); j++ {
				c := a[j]
				// rest is the option's argument when it is glued to the letter (-XGET).
				arg := func() (string, error) {
					if j+1 < len(a) {
						v := a[j+1:]
						j = len(a)
						return v, nil
					}
					return next("-" + string(c))
				}
				var err error
				switch c {
				case 's':
					o.silent = true
				case 'S':
					o.showError = true
				case 'q', 'g':
				case 'i':
					o.include = true
				case 'I':
					o.head = true
				case 'k':
					o.insecure = true
				case 'v':
					o.verbose = true
				case 'L':
					o.location = true
				case 'f':
					o.fail = true
				case 'o':
					o.output, err = arg()
				case 'w':
					o.writeOut, err = arg()
				case 'X':
					o.method, err = arg()
				case 'd':
					o.data, err = arg()
				case 'H':
					var h string
					h, err = arg()
					o.headers = append(o.headers, h)
				case 'm':
					var v string
					if v, err = arg(); err == nil {
						o.maxTime, err = seconds("-m", v)
					}
				default:
					return o, fail(2, "option -%c: is unknown", c)
				}
				if err != nil {
					return o, err
				}
			}
			continue
		}
		o.url = a
	}
	if o.url == "" {
		return o, fail(2, "no URL specified")
	}
	return o, nil
}

func fetch(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	raw := o.url
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return fail(3, "URL rejected: Malformed input to a URL function")
	}
	if o.maxTime > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.maxTime)
		defer cancel()
	}
	dialer := &net.Dialer{Timeout: o.connectTimeout}
	if o.connectTimeout == 0 {
		dialer.Timeout = 5 * time.Minute // curl's default connect timeout
	}
	if o.iface != "" {
		ip := net.ParseIP(o.iface)
		if ip == nil {
			ifc, err := net.InterfaceByName(o.iface)
			if err != nil {
				return fail(45, "bind failed: %v", err)
			}
			addrs, _ := ifc.Addrs()
			for _, a := range addrs {
				if n, ok := a.(*net.IPNet); ok {
					ip = n.IP
					break
				}
			}
			if ip == nil {
				return fail(45, "bind failed: no address on %s", o.iface)
			}
		}
		dialer.LocalAddr = &net.TCPAddr{IP: ip}
	}
	var remote string
	start := time.Now()
	var connected time.Duration
	transport := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err == nil {
				connected = time.Since(start)
				if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
					remote = ta.IP.String()
				}
			}
			return c, err
		},
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: o.insecure}, //nolint:gosec // -k, as curl
		DisableKeepAlives: true,
		Proxy:             nil,
	}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}
	if !o.location {
		client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	}
	method := o.method
	var body io.Reader
	switch {
	case method != "":
	case o.head:
		method = http.MethodHead
	case o.data != "":
		method = http.MethodPost
	default:
		method = http.MethodGet
	}
	if o.data != "" {
		body = strings.NewReader(o.data)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return fail(3, "URL rejected: %v", err)
	}
	req.Header.Set("User-Agent", "curl/8.5.0")
	req.Header.Set("Accept", "*/*")
	if o.data != "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for _, h := range o.headers {
		k, v, ok := strings.Cut(h, ":")
		if !ok {
			continue
		}
		if strings.EqualFold(strings.TrimSpace(k), "Host") {
			req.Host = strings.TrimSpace(v)
			continue
		}
		req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	if o.verbose {
		fmt.Fprintf(stderr, "> %s %s HTTP/1.1\n> Host: %s\n", method, u.RequestURI(), u.Host)
	}
	resp, err := client.Do(req)
	if err != nil {
		return classify(ctx, u, err)
	}
	defer resp.Body.Close()
	if o.verbose {
		fmt.Fprintf(stderr, "< %s %s\n", resp.Proto, resp.Status)
	}
	if o.fail && resp.StatusCode >= 400 {
		return fail(22, "The requested URL returned error: %d", resp.StatusCode)
	}
	out := stdout
	if o.output != "" && o.output != "-" {
		f, err := os.Create(o.output)
		if err != nil {
			return fail(23, "client returned ERROR on write: %v", err)
		}
		defer f.Close()
		out = f
	}
	if o.include || o.head {
		fmt.Fprintf(out, "%s %s\r\n", resp.Proto, resp.Status)
		if err := resp.Header.Write(out); err != nil {
			return fail(23, "client returned ERROR on write: %v", err)
		}
		fmt.Fprint(out, "\r\n")
	}
	if _, err := io.Copy(out, resp.Body); err != nil {
		if ctx.Err() != nil {
			return fail(28, "Operation timed out after %d milliseconds", time.Since(start).Milliseconds())
		}
		return fail(56, "Recv failure: %v", err)
	}
	if o.writeOut != "" {
		fmt.Fprint(stdout, writeOut(o.writeOut, resp.StatusCode, time.Since(start), connected, remote))
	}
	return nil
}

// classify maps a request error to curl's exit code and message.
func classify(ctx context.Context, u *url.URL, err error) error {
	var dnsErr *net.DNSError
	var opErr *net.OpError
	switch {
	case ctx.Err() != nil || isTimeout(err):
		return fail(28, "Connection timed out: %v", err)
	case errors.As(err, &dnsErr):
		return fail(6, "Could not resolve host: %s", u.Hostname())
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return fail(7, "Failed to connect to %s port %s: %v", u.Hostname(), port(u), opErr.Err)
	case errors.Is(err, io.EOF):
		return fail(52, "Empty reply from server")
	case strings.Contains(err.Error(), "tls:") || strings.Contains(err.Error(), "x509:"):
		return fail(35, "TLS connect error: %v", err)
	default:
		return fail(56, "Recv failure: %v", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func port(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if u.Scheme == "https" {
		return "443"
	}
	return "80"
}

// writeOut expands -w's variables.
func writeOut(format string, code int, total, connect time.Duration, remote string) string {
	r := strings.NewReplacer(
		"%{http_code}", fmt.Sprintf("%03d", code),
		"%{response_code}", fmt.Sprintf("%03d", code),
		"%{time_total}", fmt.Sprintf("%.6f", total.Seconds()),
		"%{time_connect}", fmt.Sprintf("%.6f", connect.Seconds()),
		"%{remote_ip}", remote,
		`\n`, "\n",
		`\t`, "\t",
	)
	return r.Replace(format)
}
