package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newDemoCmd is a placeholder until the demo command lands.
func newDemoCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "demo",
		Short:  "(not yet available)",
		Hidden: true,
		RunE:   func(*cobra.Command, []string) error { return errors.New("demo: not yet available") },
	}
}
