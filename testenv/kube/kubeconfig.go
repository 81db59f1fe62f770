package kube

import (
	"fmt"
	"path/filepath"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

func (c *Cluster) writeKubeconfig() error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["eventpipe-testenv"] = &clientcmdapi.Cluster{
		Server:                   c.apiserverURL,
		CertificateAuthorityData: c.caPEM,
	}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: c.adminToken}
	cfg.AuthInfos["agent"] = &clientcmdapi.AuthInfo{Token: c.agentToken}
	cfg.Contexts["admin"] = &clientcmdapi.Context{Cluster: "eventpipe-testenv", AuthInfo: "admin"}
	cfg.Contexts["agent"] = &clientcmdapi.Context{Cluster: "eventpipe-testenv", AuthInfo: "agent"}
	cfg.CurrentContext = "admin"
	path := filepath.Join(c.dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	c.kubeconfigPath = path
	return nil
}
