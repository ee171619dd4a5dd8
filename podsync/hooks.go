package podsync

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// HookUserAgent is the User-Agent of httpGet lifecycle hooks, the kubelet's
// "kube-lifecycle/<major>.<minor>" for the Kubernetes version nodekit matches.
const HookUserAgent = "kube-lifecycle/1.37"

// ErrInvalidHook: a lifecycle handler sets no action, or an unusable one (an
// unknown named port).
var ErrInvalidHook = errors.New("invalid handler")

// formatPod is the kubelet's format.Pod: name_namespace(uid).
func formatPod(pod *corev1.Pod) string {
	return fmt.Sprintf("%s_%s(%s)", pod.Name, pod.Namespace, pod.UID)
}

// runHook runs one lifecycle handler of container and returns the kubelet's
// message for a failure with the error.
func (s *Syncer) runHook(ctx context.Context, pod *corev1.Pod, ctr *corev1.Container, containerID string, podIPs []string, h *corev1.LifecycleHandler) (string, error) {
	switch {
	case h.Exec != nil:
		stdout, stderr, code, err := s.cfg.Runtime.ExecSync(ctx, containerID, h.Exec.Command, 0)
		output := append(append([]byte{}, stdout...), stderr...)
		if err == nil && code != 0 {
			err = fmt.Errorf("command '%s' exited with %d: %s", strings.Join(h.Exec.Command, " "), code, stderr)
		}
		if err != nil {
			return fmt.Sprintf("Exec lifecycle hook (%v) for Container %q in Pod %q failed - error: %v, message: %q",
				h.Exec.Command, ctr.Name, formatPod(pod), err, string(output)), err
		}
		return "", nil
	case h.HTTPGet != nil:
		if err := s.runHTTPHook(ctx, pod, ctr, podIPs, h.HTTPGet); err != nil {
			return fmt.Sprintf("HTTP lifecycle hook (%s) for Container %q in Pod %q failed - error: %v",
				h.HTTPGet.Path, ctr.Name, formatPod(pod), err), err
		}
		return "", nil
	case h.Sleep != nil:
		select {
		case <-ctx.Done():
			err := errors.New("container terminated before sleep hook finished")
			return fmt.Sprintf("Sleep lifecycle hook (%d) for Container %q in Pod %q failed - error: %v",
				h.Sleep.Seconds, ctr.Name, formatPod(pod), err), err
		case <-s.cfg.Clock.After(time.Duration(h.Sleep.Seconds) * time.Second):
			return "", nil
		}
	}
	err := fmt.Errorf("%w: %v", ErrInvalidHook, h)
	return fmt.Sprintf("Cannot run handler: %v", err), err
}

// runHTTPHook sends the hook's GET. Like the kubelet it ignores the response
// status; only a failed request is an error. An https request answered in plain
// HTTP is retried over http.
func (s *Syncer) runHTTPHook(ctx context.Context, pod *corev1.Pod, ctr *corev1.Container, podIPs []string, g *corev1.HTTPGetAction) error {
	host := g.Host
	if host == "" {
		if len(podIPs) == 0 {
			return fmt.Errorf("failed to find networking container: pod %s has no IP", formatPod(pod))
		}
		host = podIPs[0]
	}
	req, err := hookRequest(ctx, g, ctr, host)
	if err != nil {
		return err
	}
	resp, err := s.cfg.HTTP.Do(req)
	drain(resp)
	if err != nil && strings.Contains(err.Error(), "server gave HTTP response to HTTPS client") {
		retry := req.Clone(ctx)
		retry.URL.Scheme = "http"
		retry.Header.Del("Authorization")
		resp, herr := s.cfg.HTTP.Do(retry)
		drain(resp)
		if herr == nil {
			s.cfg.Events.Eventf(pod, corev1.EventTypeWarning, "LifecycleHTTPFallback",
				"request to HTTPS lifecycle hook %s got HTTP response, retry with HTTP succeeded", retry.URL.Host)
			err = nil
		}
	}
	return err
}

func drain(resp *http.Response) {
	if resp == nil {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	_ = resp.Body.Close()
}

// hookRequest builds the GET as the kubelet's probe/lifecycle request builder
// does: scheme lowercased, named ports resolved through the container's ports,
// the user's headers, User-Agent and Accept defaults, a Host header as the host.
func hookRequest(ctx context.Context, g *corev1.HTTPGetAction, ctr *corev1.Container, host string) (*http.Request, error) {
	scheme := strings.ToLower(string(g.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	port, err := resolvePort(g.Port, ctr)
	if err != nil {
		return nil, err
	}
	path := g.Path
	u := &url.URL{Scheme: scheme, Host: net.JoinHostPort(host, strconv.Itoa(port))}
	if path != "" && !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	ref, err := url.Parse(path)
	if err != nil {
		return nil, fmt.Errorf("%w: path %q: %v", ErrInvalidHook, g.Path, err)
	}
	u.Path, u.RawPath, u.RawQuery = ref.Path, ref.RawPath, ref.RawQuery
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	for _, h := range g.HTTPHeaders {
		req.Header.Add(h.Name, h.Value)
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header.Set("User-Agent", HookUserAgent)
	}
	if _, ok := req.Header["Accept"]; !ok {
		req.Header.Set("Accept", "*/*")
	} else if req.Header.Get("Accept") == "" {
		req.Header.Del("Accept")
	}
	// As the kubelet: the Host header, or "" (the URL's host goes on the wire).
	req.Host = req.Header.Get("Host")
	return req, nil
}

// hookError is a bad handler: its text is the kubelet's, errors.Is finds
// ErrInvalidHook.
type hookError struct{ msg string }

func (e *hookError) Error() string { return e.msg }
func (e *hookError) Unwrap() error { return ErrInvalidHook }

// resolvePort is the kubelet's probe.ResolveContainerPort: a number, or the name
// of one of the container's ports.
func resolvePort(p intstr.IntOrString, ctr *corev1.Container) (int, error) {
	port := -1
	switch p.Type {
	case intstr.Int:
		port = p.IntValue()
	case intstr.String:
		found := false
		for _, cp := range ctr.Ports {
			if cp.Name == p.StrVal {
				port, found = int(cp.ContainerPort), true
				break
			}
		}
		if !found {
			return 0, &hookError{fmt.Sprintf("port %q not found", p.StrVal)}
		}
	}
	if port > 0 && port < 65536 {
		return port, nil
	}
	return port, &hookError{fmt.Sprintf("invalid port number: %v", port)}
}

// defaultHookClient is the kubelet's lifecycle HTTP client: TLS not verified,
// no proxy, redirects followed only on the same host, at most 10.
func defaultHookClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the kubelet's hooks do not verify
			Proxy:           nil,
		},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if req.URL.Hostname() != via[0].URL.Hostname() {
				return http.ErrUseLastResponse
			}
			if len(via) >= 10 {
				return errors.New("stopped after 10 redirects")
			}
			return nil
		},
	}
}
