// Example configs. Documentation ranges only (RFC 5737, RFC 3849).

const json = (value) => JSON.stringify(value, null, 2);

export const EXAMPLES = [
  {
    id: 'two-ipv4',
    title: 'Two IPv4 ranges',
    text: json({
      cniVersion: '1.0.0',
      name: 'two-ipv4',
      type: 'macvlan',
      master: 'eth0',
      ipam: {
        type: 'whereabouts',
        ipRanges: [
          { range: '192.0.2.0/27', exclude: ['192.0.2.1/32', '192.0.2.8/30'] },
          { range: '198.51.100.0/24', range_start: '198.51.100.10', gateway: '198.51.100.1' },
        ],
      },
    }),
  },
  {
    id: 'dual-stack',
    title: 'IPv4 + IPv6 dual-stack (NetworkAttachmentDefinition)',
    text: `apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata:
  name: dual-stack
  namespace: default
spec:
  config: |
    {
      "cniVersion": "1.0.0",
      "name": "dual-stack",
      "type": "macvlan",
      "master": "eth0",
      "ipam": {
        "type": "whereabouts",
        "ipRanges": [
          { "range": "192.0.2.0/24", "gateway": "192.0.2.1", "exclude": ["192.0.2.1"] },
          { "range": "2001:db8:1::/64", "gateway": "2001:db8:1::1", "exclude": ["2001:db8:1::1/128"] }
        ]
      }
    }
`,
  },
  {
    id: 'legacy-plus-ipranges',
    title: 'Legacy range + ipRanges',
    text: json({
      cniVersion: '0.3.1',
      name: 'legacy-mix',
      type: 'bridge',
      ipam: {
        type: 'whereabouts',
        range: '203.0.113.0/24',
        range_start: '203.0.113.100',
        range_end: '203.0.113.103',
        gateway: '203.0.113.1',
        network_name: 'tenant-a',
        ipRanges: [{ range: '2001:db8:2::/120' }],
      },
    }),
  },
  {
    id: 'broken',
    title: 'Broken: a range that is not a CIDR',
    text: json({
      cniVersion: '1.0.0',
      name: 'broken',
      type: 'macvlan',
      ipam: {
        type: 'whereabouts',
        ipRanges: [{ range: '192.0.2.0/24' }, { range: '198.51.100.0/33' }],
      },
    }),
  },
];

/** The performance scenario from issue 5: a /16 and a /64. */
export const BIG = json({
  cniVersion: '1.0.0',
  name: 'big',
  type: 'macvlan',
  ipam: {
    type: 'whereabouts',
    ipRanges: [{ range: '198.18.0.0/16' }, { range: '2001:db8:ffff::/64' }],
  },
});

/**
 * Settings the "Add an example policy" picker starts each example policy with
 * (documented in docs/policies.md; edit them in the config). Addresses from
 * the documentation ranges, matching the examples above.
 */
export const POLICY_SETTINGS = {
  'keep-addresses': { deny: ['192.0.2.2', '192.0.2.4/31'], only_even: false },
  'sticky-ordinal': { base: 0, statefulsets: ['web'] },
  'namespace-ranges': { namespaces: { 'team-a': [0] }, labels: [{ key: 'tier', value: 'db', ranges: [1] }], default: [0, 1] },
  'hostile-fixtures': { hook: 'pick-address', do: 'loop' },
};
