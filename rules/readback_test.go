package rules

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestDiff(t *testing.T) {
	st := &State{Services: []Service{
		{Namespace: "default", Name: "web", Protocol: TCP, ClusterIP: ip("10.96.0.10"), Port: 80,
			Endpoints: []Endpoint{ep("10.244.1.10", 8080)}},
		{Namespace: "default", Name: "empty", Protocol: TCP, ClusterIP: ip("10.96.0.99"), Port: 80},
	}}
	dnat := func(dest string, eps ...Endpoint) KernelService {
		return KernelService{Dest: dest, Verdict: "goto service-X", Action: "dnat", Endpoints: eps}
	}
	reject := KernelService{Dest: "10.96.0.99 . tcp . 80", Verdict: "goto reject-chain", Action: "reject"}
	for _, tc := range []struct {
		name   string
		kernel []KernelService
		want   []DriftKind
	}{
		{"in sync", []KernelService{dnat("10.96.0.10 . tcp . 80", ep("10.244.1.10", 8080)), reject}, nil},
		{"stale and missing endpoint", []KernelService{dnat("10.96.0.10 . tcp . 80", ep("10.244.1.99", 8080)), reject},
			[]DriftKind{StaleEndpoint, MissingEndpoint}},
		{"service missing", []KernelService{reject}, []DriftKind{MissingService}},
		{"rejects a service with endpoints", []KernelService{
			{Dest: "10.96.0.10 . tcp . 80", Verdict: "drop", Action: "drop"}, reject}, []DriftKind{WrongVerdict}},
		{"steers a service without endpoints", []KernelService{
			dnat("10.96.0.10 . tcp . 80", ep("10.244.1.10", 8080)), dnat("10.96.0.99 . tcp . 80", ep("10.244.1.10", 8080))},
			[]DriftKind{WrongVerdict}},
		{"unexpected destination", []KernelService{dnat("10.96.0.10 . tcp . 80", ep("10.244.1.10", 8080)), reject,
			dnat("10.96.0.77 . tcp . 80")}, []DriftKind{UnexpectedService}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []DriftKind
			for _, d := range diff(tc.kernel, st) {
				got = append(got, d.Kind)
				assert.NotEmpty(t, d.Service)
			}
			assert.Equal(t, tc.want, got)
		})
	}
}
