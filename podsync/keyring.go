package podsync

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"sort"
	"strings"

	"github.com/distribution/reference"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ErrInvalidPullSecret: an image pull secret's docker config does not parse.
var ErrInvalidPullSecret = errors.New("invalid image pull secret")

// Keyring holds registry credentials as the kubelet's docker keyring does and
// finds those that apply to an image. Build it with PullSecretsKeyring.
type Keyring struct {
	index []string // keys, longest (most specific) first
	creds map[string][]*runtimeapi.AuthConfig
}

// dockerEntry is one registry's entry in a docker config; "auth" is
// base64(username:password) and wins over the separate fields.
type dockerEntry struct {
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	Auth     string `json:"auth,omitempty"`
}

// PullSecretsKeyring reads a pod's image pull secrets the kubelet's way:
// kubernetes.io/dockerconfigjson secrets ({"auths": {...}} under .dockerconfigjson)
// and kubernetes.io/dockercfg secrets (the bare map under .dockercfg); other
// secrets are skipped. A secret that does not parse is an error naming it,
// wrapping ErrInvalidPullSecret.
func PullSecretsKeyring(secrets []corev1.Secret) (*Keyring, error) {
	k := &Keyring{creds: map[string][]*runtimeapi.AuthConfig{}}
	for _, s := range secrets {
		var entries map[string]dockerEntry
		switch {
		case s.Type == corev1.SecretTypeDockerConfigJson && len(s.Data[corev1.DockerConfigJsonKey]) > 0:
			var cfg struct {
				Auths map[string]dockerEntry `json:"auths"`
			}
			if err := json.Unmarshal(s.Data[corev1.DockerConfigJsonKey], &cfg); err != nil {
				return nil, fmt.Errorf("%w %s/%s: %v", ErrInvalidPullSecret, s.Namespace, s.Name, err)
			}
			entries = cfg.Auths
		case s.Type == corev1.SecretTypeDockercfg && len(s.Data[corev1.DockerConfigKey]) > 0:
			if err := json.Unmarshal(s.Data[corev1.DockerConfigKey], &entries); err != nil {
				return nil, fmt.Errorf("%w %s/%s: %v", ErrInvalidPullSecret, s.Namespace, s.Name, err)
			}
		default:
			continue
		}
		if err := k.add(entries); err != nil {
			return nil, fmt.Errorf("%w %s/%s: %v", ErrInvalidPullSecret, s.Namespace, s.Name, err)
		}
	}
	return k, nil
}

func (k *Keyring) add(entries map[string]dockerEntry) error {
	for server, e := range entries {
		user, pass := e.Username, e.Password
		if e.Auth != "" {
			var err error
			if user, pass, err = decodeAuth(e.Auth); err != nil {
				return err
			}
		}
		if !strings.HasPrefix(server, "https://") && !strings.HasPrefix(server, "http://") {
			server = "https://" + server
		}
		u, err := url.Parse(server)
		if err != nil {
			continue // the kubelet logs and ignores such an entry
		}
		path := u.Path
		if strings.HasPrefix(path, "/v2/") || strings.HasPrefix(path, "/v1/") {
			path = path[3:]
		}
		key := u.Host
		if path != "" && path != "/" {
			key += path
		}
		if _, seen := k.creds[key]; !seen {
			k.index = append(k.index, key)
		}
		k.creds[key] = append(k.creds[key], &runtimeapi.AuthConfig{Username: user, Password: pass})
	}
	sort.Sort(sort.Reverse(sort.StringSlice(k.index)))
	return nil
}

func decodeAuth(field string) (string, string, error) {
	enc := base64.RawStdEncoding
	if strings.HasSuffix(strings.TrimSpace(field), "=") {
		enc = base64.StdEncoding
	}
	b, err := enc.DecodeString(field)
	if err != nil {
		return "", "", err
	}
	user, pass, ok := strings.Cut(string(b), ":")
	if !ok {
		return "", "", errors.New("unable to parse auth field, must be formatted as base64(username:password)")
	}
	return user, pass, nil
}

// Lookup returns the credentials for image, most specific registry key first:
// keys match by host (each dot-separated label may be a glob, as in
// *.example.com), port and path prefix; an image on Docker Hub also gets the
// index.docker.io entry. Nil when none applies (pull anonymously).
func (k *Keyring) Lookup(image string) []*runtimeapi.AuthConfig {
	if k == nil {
		return nil
	}
	repo := image
	if named, err := reference.ParseNormalizedNamed(image); err == nil {
		repo = named.Name()
	}
	var out []*runtimeapi.AuthConfig
	for _, key := range k.index {
		if urlsMatch(key, repo) {
			out = append(out, k.creds[key]...)
		}
	}
	if len(out) == 0 && onDockerHub(repo) {
		out = k.creds["index.docker.io"]
	}
	return out
}

// ImageAuth makes a Keyring usable as Credentials for pods whose secrets it was
// built from.
func (k *Keyring) ImageAuth(_ context.Context, _ *corev1.Pod, image string) ([]*runtimeapi.AuthConfig, error) {
	return k.Lookup(image), nil
}

func onDockerHub(repo string) bool {
	first, _, found := strings.Cut(repo, "/")
	if first == "" {
		return false
	}
	if !found {
		return true
	}
	if first == "docker.io" || first == "index.docker.io" {
		return true
	}
	return !strings.ContainsAny(first, ".:")
}

// urlsMatch is the kubelet's URLsMatchStr: same port, same number of host
// labels each matching its glob, and the target's path under the glob's.
func urlsMatch(glob, target string) bool {
	g, err := url.Parse("https://" + glob)
	if err != nil {
		return false
	}
	t, err := url.Parse("https://" + target)
	if err != nil {
		return false
	}
	gLabels, gPort := hostLabels(g)
	tLabels, tPort := hostLabels(t)
	if gPort != tPort || len(gLabels) != len(tLabels) || !strings.HasPrefix(t.Path, g.Path) {
		return false
	}
	for i := range gLabels {
		if ok, err := filepath.Match(gLabels[i], tLabels[i]); err != nil || !ok {
			return false
		}
	}
	return true
}

func hostLabels(u *url.URL) ([]string, string) {
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		host, port = u.Host, ""
	}
	return strings.Split(host, "."), port
}
