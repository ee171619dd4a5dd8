package volume

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"sync"
	"time"

	"github.com/go-logr/logr"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
)

// PodCertificates answers the podCertificate sources of projected volumes.
// PodCertificateIssuer is the implementation the kubelet uses.
type PodCertificates interface {
	// CredentialBundle returns the PEM private key and certificate chain of the
	// podCertificate source at sourceIndex of the pod's projected volume. It
	// drives issuance: until the signer has issued, it returns an error, and
	// each call moves the request along.
	CredentialBundle(ctx context.Context, pod *corev1.Pod, volumeName string, sourceIndex int, src *corev1.PodCertificateProjection) (key, chain []byte, err error)
	// Forget drops the credentials of the pod with uid.
	Forget(uid types.UID)
}

// Timing of pkg/kubelet/podcertificate.
const (
	// pcrAbandonAfter: a request not found this long after its creation (plus a
	// jitter) is taken as deleted and made again.
	pcrAbandonAfter = 10 * time.Minute
	// pcrMaxJitter spreads refreshes and abandonment over up to 5 minutes.
	pcrMaxJitter = 5 * time.Minute
)

// PodCertificateIssuerConfig configures a PodCertificateIssuer.
type PodCertificateIssuerConfig struct {
	// Client creates and reads PodCertificateRequests and reads the pod's
	// ServiceAccount and the Node. Required.
	Client kubernetes.Interface
	// NodeName is this node's name, written into every request. Required.
	NodeName string
	// Clock times refreshes. Default the real clock.
	Clock clock.PassiveClock
}

// PodCertificateIssuer is the kubelet's podcertificate manager
// (pkg/kubelet/podcertificate) driven by volume setup instead of a work queue:
// the first call for a source generates a key of the source's keyType and
// creates a PodCertificateRequest (generateName "req-", owned by the pod, with
// a stub PKCS#10 request as proof of possession); later calls read it until the
// signer sets Issued, Denied or Failed. An issued chain is served until its
// beginRefreshAt (plus up to 5 minutes of jitter); then a new request is made
// and the old credentials are served until it is issued. Denied and Failed are
// final for the source. A request that stays missing 10 minutes after it was
// made is made again.
type PodCertificateIssuer struct {
	cfg    PodCertificateIssuerConfig
	jitter func() time.Duration

	mu    sync.Mutex
	creds map[podCertKey]*podCertRecord
}

type podCertKey struct {
	pod         types.UID
	volume      string
	sourceIndex int
}

type podCertRecord struct {
	mu sync.Mutex
	// The issued credentials, nil until the first issuance.
	key, chain     []byte
	beginRefreshAt time.Time
	// The request in flight, "" when none, with its private key.
	pending    string
	pendingKey []byte
	abandonAt  time.Time
	// final is set once a request is denied or failed.
	final error
}

var _ PodCertificates = (*PodCertificateIssuer)(nil)

// NewPodCertificateIssuer validates cfg and returns a PodCertificateIssuer.
func NewPodCertificateIssuer(cfg PodCertificateIssuerConfig) (*PodCertificateIssuer, error) {
	if cfg.Client == nil || cfg.NodeName == "" {
		return nil, fmt.Errorf("%w: PodCertificateIssuerConfig needs Client and NodeName", ErrInvalidConfig)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &PodCertificateIssuer{
		cfg:    cfg,
		jitter: func() time.Duration { return time.Duration(mathrand.Int64N(int64(pcrMaxJitter))) },
		creds:  map[podCertKey]*podCertRecord{},
	}, nil
}

// Forget implements PodCertificates.
func (p *PodCertificateIssuer) Forget(uid types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k := range p.creds {
		if k.pod == uid {
			delete(p.creds, k)
		}
	}
}

// CredentialBundle implements PodCertificates.
func (p *PodCertificateIssuer) CredentialBundle(ctx context.Context, pod *corev1.Pod, volumeName string, sourceIndex int, src *corev1.PodCertificateProjection) ([]byte, []byte, error) {
	k := podCertKey{pod: pod.UID, volume: volumeName, sourceIndex: sourceIndex}
	p.mu.Lock()
	rec := p.creds[k]
	if rec == nil {
		rec = &podCertRecord{}
		p.creds[k] = rec
	}
	p.mu.Unlock()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.final != nil {
		return nil, nil, rec.final
	}
	if rec.pending != "" {
		if err := p.poll(ctx, pod, rec); err != nil {
			return nil, nil, err
		}
		if rec.final != nil {
			return nil, nil, rec.final
		}
	}
	now := p.cfg.Clock.Now()
	due := rec.chain == nil || !now.Before(rec.beginRefreshAt)
	if rec.pending == "" && due {
		if err := p.request(ctx, pod, src, rec); err != nil {
			what := "initial"
			if rec.chain != nil {
				what = "refresh"
			}
			err = fmt.Errorf("while creating %s PodCertificateRequest: %w", what, err)
			if rec.chain == nil {
				return nil, nil, err
			}
			logr.FromContextOrDiscard(ctx).Info("Couldn't refresh the pod certificate, serving the current one", "err", err)
		}
	}
	if rec.chain == nil {
		return nil, nil, errors.New("credential bundle is not issued yet")
	}
	return rec.key, rec.chain, nil
}

// poll reads the pending request and moves the record on when the signer has
// answered.
func (p *PodCertificateIssuer) poll(ctx context.Context, pod *corev1.Pod, rec *podCertRecord) error {
	name := pod.Namespace + "/" + rec.pending
	pcr, err := p.cfg.Client.CertificatesV1().PodCertificateRequests(pod.Namespace).Get(ctx, rec.pending, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && p.cfg.Clock.Now().After(rec.abandonAt) {
		rec.pending, rec.pendingKey = "", nil
		return fmt.Errorf("PodCertificateRequest %q appears to have been deleted", name)
	}
	if err != nil {
		if rec.chain != nil {
			return nil
		}
		return fmt.Errorf("while getting PodCertificateRequest %q: %w", name, err)
	}
	for _, c := range pcr.Status.Conditions {
		switch c.Type {
		case certificatesv1.PodCertificateRequestConditionTypeDenied:
			rec.final = fmt.Errorf("PodCertificateRequest was permanently denied: reason=%q message=%q", c.Reason, c.Message)
			return nil
		case certificatesv1.PodCertificateRequestConditionTypeFailed:
			rec.final = fmt.Errorf("PodCertificateRequest was permanently failed: reason=%q message=%q", c.Reason, c.Message)
			return nil
		case certificatesv1.PodCertificateRequestConditionTypeIssued:
			chain := cleanChain([]byte(pcr.Status.CertificateChain))
			if len(chain) == 0 || pcr.Status.BeginRefreshAt == nil {
				return fmt.Errorf("PodCertificateRequest %q is Issued without a certificate chain or beginRefreshAt", name)
			}
			rec.key, rec.chain = rec.pendingKey, chain
			rec.beginRefreshAt = pcr.Status.BeginRefreshAt.Add(p.jitter())
			rec.pending, rec.pendingKey = "", nil
			return nil
		}
	}
	return nil
}

// request generates a key and creates the PodCertificateRequest for it.
func (p *PodCertificateIssuer) request(ctx context.Context, pod *corev1.Pod, src *corev1.PodCertificateProjection, rec *podCertRecord) error {
	saName := pod.Spec.ServiceAccountName
	if saName == "" {
		saName = "default"
	}
	sa, err := p.cfg.Client.CoreV1().ServiceAccounts(pod.Namespace).Get(ctx, saName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("while fetching service account: %w", err)
	}
	node, err := p.cfg.Client.CoreV1().Nodes().Get(ctx, p.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("while getting node object: %w", err)
	}
	priv, proof, err := keyAndProof(src.KeyType)
	if err != nil {
		return fmt.Errorf("while generating keypair: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return fmt.Errorf("while PEM-encoding private key: %w", err)
	}
	req := &certificatesv1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       pod.Namespace,
			GenerateName:    "req-",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}},
		},
		Spec: certificatesv1.PodCertificateRequestSpec{
			SignerName:                src.SignerName,
			PodName:                   pod.Name,
			PodUID:                    pod.UID,
			ServiceAccountName:        saName,
			ServiceAccountUID:         sa.UID,
			NodeName:                  types.NodeName(p.cfg.NodeName),
			NodeUID:                   node.UID,
			MaxExpirationSeconds:      src.MaxExpirationSeconds,
			StubPKCS10Request:         proof,
			UnverifiedUserAnnotations: src.UserAnnotations,
		},
	}
	created, err := p.cfg.Client.CertificatesV1().PodCertificateRequests(pod.Namespace).Create(ctx, req, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("while creating on API: %w", err)
	}
	rec.pending = created.Name
	rec.pendingKey = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	rec.abandonAt = created.CreationTimestamp.Add(pcrAbandonAfter + p.jitter())
	logr.FromContextOrDiscard(ctx).V(4).Info("PodCertificateRequest created", "pcr", pod.Namespace+"/"+created.Name)
	return nil
}

// keyAndProof makes a private key of keyType (the API's names) and a stub
// PKCS#10 request signed with it.
func keyAndProof(keyType string) (crypto.Signer, []byte, error) {
	var priv crypto.Signer
	var err error
	switch keyType {
	case "RSA3072":
		priv, err = rsa.GenerateKey(rand.Reader, 3072)
	case "RSA4096":
		priv, err = rsa.GenerateKey(rand.Reader, 4096)
	case "ECDSAP256":
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case "ECDSAP384":
		priv, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case "ECDSAP521":
		priv, err = ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	case "ED25519":
		_, priv, err = ed25519.GenerateKey(rand.Reader)
	default:
		return nil, nil, fmt.Errorf("unknown key type %q", keyType)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("while generating %s key: %w", keyType, err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, priv)
	if err != nil {
		return nil, nil, fmt.Errorf("while generating stub PKCS#10 request: %w", err)
	}
	return priv, csr, nil
}

// cleanChain re-encodes every PEM block as a header-less CERTIFICATE block.
func cleanChain(in []byte) []byte {
	var out bytes.Buffer
	for {
		var b *pem.Block
		b, in = pem.Decode(in)
		if b == nil {
			return out.Bytes()
		}
		out.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: b.Bytes}))
	}
}
