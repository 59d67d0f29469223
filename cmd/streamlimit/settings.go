package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"
)

// envName returns the environment variable that sets flag name: STREAMLIMIT_ and the name
// in upper case with '-' as '_' (--redis-addr is STREAMLIMIT_REDIS_ADDR).
func envName(flag string) string {
	return "STREAMLIMIT_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// envAliases returns further variables accepted for a flag, so that one environment serves
// the test suite and the binary (STREAMLIMIT_KAFKA_BROKERS is what make test exports), and
// those a command names for the flag (setEnvAliases).
func envAliases(f *pflag.Flag) []string {
	var names []string
	switch f.Name {
	case "brokers":
		names = []string{"STREAMLIMIT_KAFKA_BROKERS"}
	case "redis-addr":
		names = []string{"STREAMLIMIT_REDIS_ADDR"}
	}
	return append(names, f.Annotations[envAliasAnnotation]...)
}

// envAliasAnnotation is the flag annotation that lists a flag's further environment
// variables.
const envAliasAnnotation = "streamlimit_env_aliases"

// setEnvAliases makes the flag named flag of fs read the environment variables names too,
// after its own (envName): the enforcer reads envoyproxy/ratelimit's names for the settings
// that mean the same thing, so that a deployment of it can swap the binary.
func setEnvAliases(fs *pflag.FlagSet, flag string, names ...string) {
	if err := fs.SetAnnotation(flag, envAliasAnnotation, names); err != nil {
		panic(err) // a flag this program defines: a programming error
	}
}

// addConfigFlag adds --config to cmd and makes its PreRunE apply settings from the
// environment and from that file to every flag not given on the command line. The order is
// flag > environment > file > default. A file setting that names no flag, or whose value
// the flag rejects, is an error that names the file, the line and the reason.
func addConfigFlag(cmd *cobra.Command) {
	var path string
	cmd.Flags().StringVar(&path, "config", os.Getenv("STREAMLIMIT_CONFIG"),
		"YAML file of settings named like the flags, e.g. \"redis-addr: 127.0.0.1:6379\" (env STREAMLIMIT_CONFIG)")
	prev := cmd.PreRunE
	cmd.PreRunE = func(cmd *cobra.Command, args []string) error {
		if err := applySettings(cmd.Flags(), path, os.LookupEnv); err != nil {
			return err
		}
		if prev != nil {
			return prev(cmd, args)
		}
		return nil
	}
}

// applySettings sets every flag of fs not changed on the command line from the environment
// (lookup) or else from the YAML file at path ("" for none).
func applySettings(fs *pflag.FlagSet, path string, lookup func(string) (string, bool)) error {
	file, err := readSettingsFile(path, fs)
	if err != nil {
		return err
	}
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || f.Name == "config" || f.Name == "help" {
			return
		}
		for _, env := range append([]string{envName(f.Name)}, envAliases(f)...) {
			if v, ok := lookup(env); ok && v != "" {
				if err := fs.Set(f.Name, v); err != nil {
					errs = append(errs, fmt.Errorf("%s=%q: %w", env, v, err))
				}
				return
			}
		}
		if s, ok := file[f.Name]; ok {
			for _, v := range s.values {
				if err := setFromFile(fs, f, v); err != nil {
					errs = append(errs, fmt.Errorf("%s:%d: %s: %w", path, s.line, f.Name, err))
					return
				}
			}
		}
	})
	return errors.Join(errs...)
}

// setFromFile sets one value; list flags (slices) append, so that a YAML list gives all
// its items.
func setFromFile(fs *pflag.FlagSet, f *pflag.Flag, v string) error {
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		if !f.Changed {
			if err := sv.Replace(nil); err != nil {
				return err
			}
			f.Changed = true
		}
		return sv.Append(v)
	}
	return fs.Set(f.Name, v)
}

type setting struct {
	line   int
	values []string
}

func readSettingsFile(path string, fs *pflag.FlagSet) (map[string]setting, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return nil, nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s:%d: want a mapping of setting: value", path, root.Line)
	}
	out := make(map[string]setting)
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if fs.Lookup(k.Value) == nil || k.Value == "config" {
			return nil, fmt.Errorf("%s:%d: unknown setting %q (settings are named like the command's flags)", path, k.Line, k.Value)
		}
		if _, dup := out[k.Value]; dup {
			return nil, fmt.Errorf("%s:%d: setting %q given twice", path, k.Line, k.Value)
		}
		s := setting{line: k.Line}
		switch v.Kind {
		case yaml.ScalarNode:
			s.values = []string{v.Value}
		case yaml.SequenceNode:
			for _, item := range v.Content {
				if item.Kind != yaml.ScalarNode {
					return nil, fmt.Errorf("%s:%d: %s: list items must be plain values", path, item.Line, k.Value)
				}
				s.values = append(s.values, item.Value)
			}
		default:
			return nil, fmt.Errorf("%s:%d: %s: want a value or a list of values", path, v.Line, k.Value)
		}
		out[k.Value] = s
	}
	return out, nil
}
