package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the cluster's certificate authority and the files made from it,
// under Dir/pki. Every component gets its own client identity, named the way
// the default RBAC bootstrap policy knows them.
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

func newPKI(c *Config) (*pki, error) {
	p := &pki{dir: c.p("pki")}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "cube-local-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	p.caCert, _ = x509.ParseCertificate(der)
	p.caKey = key
	if err := writePEM(p.path("ca.crt"), "CERTIFICATE", der); err != nil {
		return nil, err
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	if err := writePEM(p.path("ca.key"), "EC PRIVATE KEY", kb); err != nil {
		return nil, err
	}
	// The service-account signing key (RSA: what every client library expects).
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	if err := writePEM(p.path("sa.key"), "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa)); err != nil {
		return nil, err
	}
	pub, _ := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err := writePEM(p.path("sa.pub"), "PUBLIC KEY", pub); err != nil {
		return nil, err
	}
	return p, nil
}

// issue writes <name>.crt and <name>.key signed by the CA: a client
// certificate for cn/orgs, and a server one too when hosts is non-empty.
func (p *pki) issue(name, cn string, orgs []string, hosts []string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(5 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		return fmt.Errorf("certificate %s: %w", name, err)
	}
	if err := writePEM(p.path(name+".crt"), "CERTIFICATE", der); err != nil {
		return err
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	return writePEM(p.path(name+".key"), "EC PRIVATE KEY", kb)
}

// kubeconfig writes a kubeconfig for the identity <name> to path.
func (p *pki) kubeconfig(path, name, server string) error {
	content := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: cube-local
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: cube-local
  context: {cluster: cube-local, user: %s}
current-context: cube-local
`, server, p.path("ca.crt"), name, p.path(name+".crt"), p.path(name+".key"), name)
	return os.WriteFile(path, []byte(content), 0o600)
}

func writePEM(path, typ string, der []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if err := pem.Encode(f, &pem.Block{Type: typ, Bytes: der}); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// makePKI issues every identity and kubeconfig the cluster uses.
func makePKI(c *Config) error {
	p, err := newPKI(c)
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	ip := c.NodeIP.String()
	server := "https://" + ip + ":6443"
	type ident struct {
		name, cn string
		orgs     []string
		hosts    []string
	}
	ids := []ident{
		{"apiserver", "kube-apiserver", nil, []string{ip, c.APIIP.String(), "127.0.0.1", "localhost", "kubernetes",
			"kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}},
		{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil},
		{"admin", "cube-local-admin", []string{"system:masters"}, nil},
		{"controller-manager", "system:kube-controller-manager", nil, nil},
		{"scheduler", "system:kube-scheduler", nil, nil},
		{"kube-proxy", "system:kube-proxy", nil, nil},
		{"kubelet", "system:node:" + c.NodeName, []string{"system:nodes"}, nil},
	}
	for _, id := range ids {
		if err := p.issue(id.name, id.cn, id.orgs, id.hosts); err != nil {
			return err
		}
	}
	for _, n := range []string{"controller-manager", "scheduler", "kube-proxy", "kubelet"} {
		if err := p.kubeconfig(c.p("pki", n+".kubeconfig"), n, server); err != nil {
			return err
		}
	}
	return p.kubeconfig(c.kubeconfig(), "admin", server)
}
