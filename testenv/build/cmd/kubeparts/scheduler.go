package main

// kube-scheduler, as its upstream main (k8s.io/kubernetes/cmd/kube-scheduler)
// runs it: it binds pods to nodes and writes Scheduled and FailedScheduling.

import (
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format, as upstream
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as upstream
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as upstream
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func init() {
	register("kube-scheduler", func(args []string) int {
		cmd := app.NewSchedulerCommand()
		cmd.SetArgs(args)
		return cli.Run(cmd)
	})
}
