package probe

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The API server's defaults for a corev1.Probe (SetDefaults_Probe).
const (
	DefaultTimeoutSeconds   = 1
	DefaultPeriodSeconds    = 10
	DefaultSuccessThreshold = 1
	DefaultFailureThreshold = 3
)

// maxProbeRetries is how many times the kubelet runs a probe whose attempt
// returned an error (not a Failure) before giving up.
const maxProbeRetries = 3

// WithDefaults returns a copy of p with the API server's defaults applied to
// every zero field: timeoutSeconds 1, periodSeconds 10, successThreshold 1,
// failureThreshold 3. initialDelaySeconds stays 0. A nil p yields nil.
func WithDefaults(p *corev1.Probe) *corev1.Probe {
	if p == nil {
		return nil
	}
	c := p.DeepCopy()
	if c.TimeoutSeconds == 0 {
		c.TimeoutSeconds = DefaultTimeoutSeconds
	}
	if c.PeriodSeconds == 0 {
		c.PeriodSeconds = DefaultPeriodSeconds
	}
	if c.SuccessThreshold == 0 {
		c.SuccessThreshold = DefaultSuccessThreshold
	}
	if c.FailureThreshold == 0 {
		c.FailureThreshold = DefaultFailureThreshold
	}
	return c
}

// Validate checks p the way the API server's pod validation does, for a probe of
// type t (zero fields count as their defaults): exactly one handler, non-negative numbers, a
// successThreshold of 1 for liveness and startup probes, a terminationGracePeriodSeconds
// above 0 when set, ports in range, a non-empty exec command and an http or https
// scheme. When container is not nil, a named port must be one of its ports.
// Errors wrap ErrInvalidProbe (or ErrUnknownPort) and name the field at fault;
// several faults are joined.
func Validate(p *corev1.Probe, t Type, container *corev1.Container) error {
	if p == nil {
		return ErrNilProbe
	}
	var errs []error
	bad := func(field string, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrInvalidProbe, field, fmt.Sprintf(format, args...)))
	}
	n := 0
	for _, set := range []bool{p.Exec != nil, p.HTTPGet != nil, p.TCPSocket != nil, p.GRPC != nil} {
		if set {
			n++
		}
	}
	switch {
	case n == 0:
		errs = append(errs, ErrNoHandler)
	case n > 1:
		errs = append(errs, ErrMultipleHandlers)
	}
	for _, f := range []struct {
		name string
		v    int32
	}{
		{"initialDelaySeconds", p.InitialDelaySeconds},
		{"timeoutSeconds", p.TimeoutSeconds},
		{"periodSeconds", p.PeriodSeconds},
		{"successThreshold", p.SuccessThreshold},
		{"failureThreshold", p.FailureThreshold},
	} {
		if f.v < 0 {
			bad(f.name, "must be greater than or equal to 0, got %d", f.v)
		}
	}
	if (t == Liveness || t == Startup) && p.SuccessThreshold != 1 && p.SuccessThreshold != 0 {
		bad("successThreshold", "must be 1 for a %s probe, got %d", strings.ToLower(t.String()), p.SuccessThreshold)
	}
	if p.TerminationGracePeriodSeconds != nil && *p.TerminationGracePeriodSeconds <= 0 {
		bad("terminationGracePeriodSeconds", "must be greater than 0, got %d", *p.TerminationGracePeriodSeconds)
	}
	if p.Exec != nil && len(p.Exec.Command) == 0 {
		bad("exec.command", "required value")
	}
	if h := p.HTTPGet; h != nil {
		if s := strings.ToLower(string(h.Scheme)); s != "" && s != "http" && s != "https" {
			bad("httpGet.scheme", "unsupported value %q: supported values are HTTP, HTTPS", h.Scheme)
		}
		if err := checkPort("httpGet.port", h.Port, container); err != nil {
			errs = append(errs, err)
		}
	}
	if s := p.TCPSocket; s != nil {
		if err := checkPort("tcpSocket.port", s.Port, container); err != nil {
			errs = append(errs, err)
		}
	}
	if g := p.GRPC; g != nil && (g.Port < 1 || g.Port > 65535) {
		errs = append(errs, fmt.Errorf("%w: %w: grpc.port: %d", ErrInvalidProbe, ErrInvalidPort, g.Port))
	}
	return errors.Join(errs...)
}

func checkPort(field string, port intstr.IntOrString, container *corev1.Container) error {
	if port.Type == intstr.String && container == nil {
		if port.StrVal == "" {
			return fmt.Errorf("%w: %w: %s: empty port name", ErrInvalidProbe, ErrInvalidPort, field)
		}
		return nil
	}
	if _, err := resolvePort(port, container); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrInvalidProbe, field, err)
	}
	return nil
}

// resolvePort turns a probe's port into a number, looking names up in the
// container's ports like the kubelet's ResolveContainerPort.
func resolvePort(port intstr.IntOrString, container *corev1.Container) (int, error) {
	n := -1
	switch port.Type {
	case intstr.Int:
		n = port.IntValue()
	case intstr.String:
		found := false
		if container != nil {
			for _, cp := range container.Ports {
				if cp.Name == port.StrVal {
					n, found = int(cp.ContainerPort), true
					break
				}
			}
		}
		if !found {
			return 0, fmt.Errorf("%w: port %q not found in container %s", ErrUnknownPort, port.StrVal, containerName(container))
		}
	default:
		return n, fmt.Errorf("%w: intOrString had no kind: %+v", ErrInvalidPort, port)
	}
	if n > 0 && n < 65536 {
		return n, nil
	}
	return n, fmt.Errorf("%w: %v", ErrInvalidPort, n)
}

func containerName(c *corev1.Container) string {
	if c == nil {
		return "(none)"
	}
	return fmt.Sprintf("%q", c.Name)
}

// ExpandCommand substitutes $(VAR) references in an exec probe's command with the
// static values of env, as the kubelet's ExpandContainerCommandOnlyStatic does:
// $$ becomes $, an unknown $(VAR) stays as written, an unterminated $( stays, and
// variables set through valueFrom expand to the empty string (the kubelet only sees
// their empty Value).
func ExpandCommand(cmd []string, env []corev1.EnvVar) []string {
	if len(cmd) == 0 {
		return nil
	}
	vars := make(map[string]string, len(env))
	for _, e := range env {
		vars[e.Name] = e.Value
	}
	out := make([]string, len(cmd))
	for i, s := range cmd {
		out[i] = expand(s, vars)
	}
	return out
}

func expand(s string, vars map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b bytes.Buffer
	last := 0
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			continue
		}
		b.WriteString(s[last:i])
		rest := s[i+1:]
		r, size := utf8.DecodeRuneInString(rest)
		switch r {
		case '$':
			b.WriteByte('$')
			i += size
		case '(':
			end := strings.IndexByte(rest[1:], ')')
			if end < 0 {
				b.WriteString("$(")
				i++
				break
			}
			name := rest[1 : 1+end]
			if v, ok := vars[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(" + name + ")")
			}
			i += end + 2
		default:
			// Like upstream, an invalid UTF-8 byte here comes out as U+FFFD.
			b.WriteByte('$')
			b.WriteRune(r)
			i += size
		}
		last = i + 1
	}
	b.WriteString(s[last:])
	return b.String()
}
