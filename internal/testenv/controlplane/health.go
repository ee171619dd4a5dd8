package controlplane

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/nodekit-dev/nodekit/internal/testenv"
)

// healthClient reaches a component's own health endpoint, served with a certificate the
// component made for itself; the check is liveness on loopback, not identity.
func healthClient() *http.Client {
	return &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // loopback health check of a self-signed peer
			DisableKeepAlives: true,
		},
	}
}

func getOK(ctx context.Context, c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, body)
	}
	return nil
}

// healthz is the readiness check of a component p started to serve on port: /healthz
// answers 200 and the listener is p's own, not another process's on a port both chose
// (the unverified TLS above cannot tell them apart).
func healthz(p *testenv.Process, port int) func(context.Context) error {
	hc := healthClient()
	url := "https://127.0.0.1:" + strconv.Itoa(port) + "/healthz"
	return func(ctx context.Context) error {
		if err := getOK(ctx, hc, url); err != nil {
			return err
		}
		return p.CheckListening(port)
	}
}
