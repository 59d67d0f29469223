package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newRulesCmd is a placeholder until the rules command lands.
func newRulesCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "rules",
		Short:  "(not yet available)",
		Hidden: true,
		RunE:   func(*cobra.Command, []string) error { return errors.New("rules: not yet available") },
	}
}
