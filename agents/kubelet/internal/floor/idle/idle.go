// Package idle holds what the two measuring programs internal/floor and
// internal/floor/bare share: their flags, their process life and the CRI side of
// a kubelet's idle work. It imports neither the clientset nor k8s.io/apiserver, so
// bare stays free of both.
package idle

import (
	"context"
	"crypto/tls"
	"errors"
	goflag "flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/wait"
	certutil "k8s.io/client-go/util/cert"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
)

// Options are the flags both programs take, named as the kubelet's.
type Options struct {
	Kubeconfig, Node, Endpoint, ClientCA string
	Port                                 int
}

// Main parses the flags, runs run until SIGTERM or SIGINT and exits 1 if it failed.
func Main(name string, run func(context.Context, Options) error) {
	var o Options
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig of the node's identity")
	fs.StringVar(&o.Node, "hostname-override", "", "the Node's name")
	fs.StringVar(&o.Endpoint, "container-runtime-endpoint", "", "the CRI socket, unix:///...")
	fs.StringVar(&o.ClientCA, "client-ca-file", "", "CA bundle for client certificates")
	fs.IntVar(&o.Port, "port", 10250, "HTTPS port")
	klogFlags := goflag.NewFlagSet("klog", goflag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
	if err := fs.Parse(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if os.Getenv("GOGC") == "" {
		// The garbage collector's target of nodekit's kubelet (its defaultGCPercent),
		// so that a floor is measured on the same footing as the kubelet above it.
		debug.SetGCPercent(50)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := check(o)
	if err == nil {
		err = run(ctx, o)
	}
	stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		klog.ErrorS(err, "Failed", "program", name)
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

func check(o Options) error {
	if o.Kubeconfig == "" || o.Node == "" || o.Endpoint == "" {
		return errors.New("--kubeconfig, --hostname-override and --container-runtime-endpoint are required")
	}
	return nil
}

// Runtime connects to the CRI endpoint, asks its Version, and runs the CRI half of
// a kubelet's idle work in the background until ctx ends: runtime Status every
// 10 s and, as the kubelet's PLEG does, a relist of sandboxes and containers every
// second, each relist's count of ready sandboxes given to relisted (which may be
// nil). The connection closes when ctx ends.
func Runtime(ctx context.Context, endpoint string, relisted func(readySandboxes int)) error {
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("CRI %s: %w", endpoint, err)
	}
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	v, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("CRI Version: %w", err)
	}
	klog.InfoS("Container runtime initialized", "containerRuntime", v.RuntimeName, "version", v.RuntimeVersion, "apiVersion", v.RuntimeApiVersion)
	go func() {
		<-ctx.Done()
		_ = conn.Close()
	}()
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		if _, err := rt.Status(ctx, &runtimeapi.StatusRequest{}); err != nil && ctx.Err() == nil {
			klog.ErrorS(err, "Container runtime status check failed")
		}
	}, 10*time.Second)
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		sandboxes, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
		if err == nil {
			_, err = rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		}
		if err != nil {
			if ctx.Err() == nil {
				klog.ErrorS(err, "Relist of the runtime failed")
			}
			return
		}
		ready := 0
		for _, s := range sandboxes.Items {
			if s.State == runtimeapi.PodSandboxState_SANDBOX_READY {
				ready++
			}
		}
		if relisted != nil {
			relisted(ready)
		}
	}, time.Second)
	return nil
}

// Serve serves h over HTTPS on port with a self-signed certificate for node, asking
// clients for a certificate without requiring one (as the kubelet's port does),
// until ctx ends.
func Serve(ctx context.Context, node string, port int, h http.Handler) error {
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(node, nil, nil)
	if err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           h,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	klog.InfoS("Starting to listen", "address", ln.Addr().String())
	if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return ctx.Err()
}
