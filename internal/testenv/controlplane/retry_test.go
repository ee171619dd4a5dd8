package controlplane

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodekit-dev/nodekit/internal/testenv"
)

// TestStartRetriesWhenAPortIsTaken replays the race seen in CI, where two control
// planes chose the same ports: the first attempt is handed a port that another
// process already serves on (for etcd, a listener that accepts and says nothing, as a
// foreign etcd looks to a dial; for kube-apiserver, a TLS server with its own
// certificate that answers "ok" to everything, as a foreign API server's /readyz
// does). Start must notice, remove that attempt and succeed on fresh ports, saying so.
func TestStartRetriesWhenAPortIsTaken(t *testing.T) {
	tests := []struct {
		name    string
		index   int // in the ports setup asks for: etcd client, etcd peer, kube-apiserver, ...
		foreign func(t *testing.T) int
	}{
		{name: "etcd client port", index: 0, foreign: silentListener},
		{name: "kube-apiserver port", index: 2, foreign: foreignTLSServer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			taken := tt.foreign(t)
			var mu sync.Mutex
			var handedOut [][]int
			opts := Options{pickPorts: func(n int) ([]int, error) {
				ports, err := testenv.FreePorts(n)
				if err != nil {
					return nil, err
				}
				mu.Lock()
				defer mu.Unlock()
				if len(handedOut) == 0 {
					ports[tt.index] = taken
				}
				handedOut = append(handedOut, ports)
				return ports, nil
			}}
			rec := &testenv.LogRecorder{T: t}
			cp := Start(rec, opts)

			mu.Lock()
			assert.Len(t, handedOut, 2, "one retry on fresh ports")
			mu.Unlock()
			retries := rec.Matching("lost a port race")
			require.Len(t, retries, 1, "Start must log why it started again")
			assert.Contains(t, retries[0], "attempt 1 of 3")
			assert.Contains(t, retries[0], testenv.ErrPortTaken.Error())
			// The abandoned attempt's folder is gone; the second attempt's is in use.
			m := regexp.MustCompile(`removed (\S+),`).FindStringSubmatch(retries[0])
			require.NotNil(t, m, "the retry line names the removed folder: %s", retries[0])
			_, err := os.Stat(m[1])
			assert.ErrorIs(t, err, os.ErrNotExist, "first attempt's folder %s", m[1])
			assert.NotEqual(t, m[1], cp.Dir())

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			assert.NotEqual(t, fmt.Sprintf("https://127.0.0.1:%d", taken), cp.URL())
			body, err := cp.AdminClient().Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
			require.NoError(t, err)
			assert.Equal(t, "ok", string(body))
			// The API server stores in its own etcd: a Node made now is there.
			cp.CreateNode(t, "after-retry")
		})
	}
}

// silentListener accepts connections on a loopback port and never answers.
func silentListener(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().(*net.TCPAddr).Port
}

// foreignTLSServer is an HTTPS server with a certificate of its own that says "ok"
// to every path, /readyz included.
func foreignTLSServer(t *testing.T) int {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	// Clients that refuse its certificate are the point, not news.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().(*net.TCPAddr).Port
}

// TestReadyzTellsAForeignAPIServer checks the readiness check's verdicts without peers:
// an answer from a server whose certificate the CA bundle did not sign is a lost port
// (ErrPortTaken, so Start retries), a bundle read before it holds its CA is only "not
// yet", and our own server's "ok" is ready.
func TestReadyzTellsAForeignAPIServer(t *testing.T) {
	ca, err := newAuthority()
	require.NoError(t, err)
	ours := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	ours.TLS = &tls.Config{Certificates: []tls.Certificate{servingCert(t, ca)}}
	ours.StartTLS()
	defer ours.Close()
	foreignPort := foreignTLSServer(t)

	clientCert, clientKey, err := ca.clientCert("nodekit-admin", "system:masters")
	require.NoError(t, err)
	// What a read half-way through kube-apiserver's write sees: the leaf, not its CA.
	leafOnly := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ours.TLS.Certificates[0].Certificate[0]})
	bundle := ca.certPEM
	tests := []struct {
		name     string
		port     int
		caFile   []byte
		wantErr  string
		wantLost bool
	}{
		{name: "our server", port: ours.Listener.Addr().(*net.TCPAddr).Port, caFile: bundle},
		{name: "foreign server", port: foreignPort, caFile: bundle, wantErr: "presents a certificate this kube-apiserver did not make", wantLost: true},
		{name: "bundle without its CA yet", port: foreignPort, caFile: leafOnly, wantErr: "does not hold its CA yet"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cp := &ControlPlane{dir: t.TempDir(), apiPort: tt.port}
			require.NoError(t, os.MkdirAll(cp.path("apiserver-certs"), 0o700))
			cp.adminConfig = cp.restConfig(clientCert, clientKey)
			require.NoError(t, os.WriteFile(cp.adminConfig.CAFile, tt.caFile, 0o600))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := cp.readyz(ctx)
			if tt.wantErr == "" {
				require.NoError(t, err)
				assert.NotNil(t, cp.AdminClient(), "a ready check keeps its client")
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
			assert.Equal(t, tt.wantLost, errors.Is(err, testenv.ErrPortTaken), "%v", err)
		})
	}
}

// servingCert is a 127.0.0.1 serving certificate signed by ca.
func servingCert(t *testing.T, ca *authority) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
