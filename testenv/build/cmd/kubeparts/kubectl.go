package main

// kubectl, as its upstream main (k8s.io/kubernetes/cmd/kubectl) runs it: the
// docs test runs the kubectl lines of the README and the chart's NOTES as
// printed, through a `kubectl` symlink to this binary (build.sh makes it).

import (
	"os"

	_ "k8s.io/client-go/plugin/pkg/client/auth" // client auth plugins, as upstream
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func init() {
	register("kubectl", func(args []string) int {
		// kubectl reads os.Args itself (plugins, verbosity, .kuberc), so it
		// gets the command line it would have as its own binary.
		os.Args = append([]string{"kubectl"}, args...)
		logs.GlogSetter(cmd.GetLogVerbosity(os.Args)) //nolint:errcheck // as upstream
		if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
			util.CheckErr(err) // prints the error and exits 1, as upstream
		}
		return 0
	})
}
