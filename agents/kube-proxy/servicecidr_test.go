package main

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestServiceCIDRWatch: the union of every ServiceCIDR's CIDRs is reported after
// the initial list and on each change of the union, not on changes that leave
// it alone; a CIDR two objects share stays until both are gone.
func TestServiceCIDRWatch(t *testing.T) {
	sc := func(name string, cidrs ...string) *networkingv1.ServiceCIDR {
		return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
	}
	client := fake.NewClientset(sc("kubernetes", "10.96.0.0/16", "fd00:10:96::/112"))
	var mu sync.Mutex
	var got []string
	w := newServiceCIDRWatch(client, 0, func(c []netip.Prefix) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, fmt.Sprint(c))
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	reports := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
	waitFor := func(want ...string) {
		t.Helper()
		require.Eventually(t, func() bool { return assert.ObjectsAreEqual(want, reports()) }, 10*time.Second, 5*time.Millisecond,
			"reports %v, want %v", reports(), want)
	}
	first := "[10.96.0.0/16 fd00:10:96::/112]"
	waitFor(first)

	cli := client.NetworkingV1().ServiceCIDRs()
	_, err := cli.Create(ctx, sc("extra", "10.97.0.0/24", "10.96.0.0/16"), metav1.CreateOptions{})
	require.NoError(t, err)
	second := "[10.96.0.0/16 10.97.0.0/24 fd00:10:96::/112]"
	waitFor(first, second)

	// An update that keeps the union reports nothing.
	_, err = cli.Update(ctx, sc("kubernetes", "fd00:10:96::/112", "10.96.0.0/16"), metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, cli.Delete(ctx, "kubernetes", metav1.DeleteOptions{}))
	third := "[10.96.0.0/16 10.97.0.0/24]"
	waitFor(first, second, third)
	require.NoError(t, cli.Delete(ctx, "extra", metav1.DeleteOptions{}))
	waitFor(first, second, third, "[]")
}
