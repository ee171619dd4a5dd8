// Command etcd is a single-member etcd server for nodekit's tests, built on
// go.etcd.io/etcd/server/v3/embed at the version k8s.io/kubernetes requires.
//
// Debian ships etcd 3.4, older than kube-apiserver 1.37 expects, and release
// binaries cannot be downloaded here, so the harness runs this instead. It takes
// only the flags the harness needs and exits when the server stops or on SIGTERM.
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "etcd:", err)
		os.Exit(1)
	}
}

func run() error {
	dataDir := flag.String("data-dir", "", "directory for the member's data (required)")
	clientURL := flag.String("listen-client-urls", "http://127.0.0.1:2379", "URL to serve clients on")
	peerURL := flag.String("listen-peer-urls", "http://127.0.0.1:2380", "URL to serve peers on")
	unsafeNoFsync := flag.Bool("unsafe-no-fsync", false, "skip fsync: for tests only")
	flag.Parse()
	if *dataDir == "" {
		return fmt.Errorf("--data-dir is required")
	}

	client, err := url.Parse(*clientURL)
	if err != nil {
		return fmt.Errorf("--listen-client-urls: %w", err)
	}
	peer, err := url.Parse(*peerURL)
	if err != nil {
		return fmt.Errorf("--listen-peer-urls: %w", err)
	}

	cfg := embed.NewConfig()
	cfg.Name = "nodekit-test"
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{*client}
	cfg.AdvertiseClientUrls = []url.URL{*client}
	cfg.ListenPeerUrls = []url.URL{*peer}
	cfg.AdvertisePeerUrls = []url.URL{*peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	cfg.UnsafeNoFsync = *unsafeNoFsync
	cfg.LogLevel = "warn"

	srv, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	defer srv.Close()

	select {
	case <-srv.Server.ReadyNotify():
		fmt.Fprintln(os.Stderr, "etcd: ready to serve client requests on", client.String())
	case <-time.After(60 * time.Second):
		return fmt.Errorf("not ready after 60s")
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case err := <-srv.Err():
		return err
	case <-sig:
		return nil
	}
}
