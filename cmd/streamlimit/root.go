package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at link time with -ldflags "-X main.version=v1.2.3"; otherwise the module
// version from the build info is used.
var version = ""

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "streamlimit",
		Short: "Global rate limiting across data centers, counted through Kafka",
		Long: `streamlimit enforces rate limits globally across data centers without a central
store on the request path: instances publish hits to Kafka, an aggregator turns them into
sliding-window counts across all sites, and enforcers decide locally from that snapshot
plus their own exact counts.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// --version prints what the version command prints, as most tools answer it.
		Version: buildVersion(),
	}
	root.SetVersionTemplate("streamlimit {{.Version}}\n")
	root.AddCommand(newVersionCmd(), newTopicsCmd(), newAggregatorCmd(), newEnforcerCmd(),
		newCountsCmd(), newRulesCmd(), newDemoCmd(), newDevCmd(), newSimCmd())
	return root
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the streamlimit version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), "streamlimit", buildVersion())
			return nil
		},
	}
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
