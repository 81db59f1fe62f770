package main

// kube-controller-manager, as its upstream main
// (k8s.io/kubernetes/cmd/kube-controller-manager) runs it; testenv/kube
// chooses the controllers (volume binding, namespaces, quota, garbage
// collection, service accounts).

import (
	_ "time/tzdata" // CronJob time zones, as upstream

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func init() {
	register("kube-controller-manager", func(args []string) int {
		cmd := app.NewControllerManagerCommand()
		cmd.SetArgs(args)
		return cli.Run(cmd)
	})
}
