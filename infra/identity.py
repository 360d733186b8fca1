"""The key devices' secrets and enrollments' group keys are sealed under
(functions/auth/sealing.py): a symmetric KMS key that rotates yearly (KMS keeps every earlier
key material, so what was sealed before still opens), used by the API function alone, and only
with the service's encryption context (``kms:EncryptionContext:service``), so no other caller's
ciphertext can be opened with it through the function's role, and CloudTrail names what each
Decrypt opened (a device and credential, or an enrollment)."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from functions.auth.sealing import SEALING_KMS_KEY, SERVICE

from .device_tokens import ADMIN_ACTIONS

SEAL_ACTIONS = ("kms:Encrypt", "kms:Decrypt")
CONTEXT_CONDITION = {"StringEquals": {"kms:EncryptionContext:service": SERVICE}}


class Sealing(Construct):
    """``environment``: what the API function reads to seal and open secrets (``grant_seal``)."""

    def __init__(self, scope: Construct, construct_id: str, *, throwaway: bool):
        super().__init__(scope, construct_id)
        # The key policy names who may seal and open (the API function's role, ``grant_seal``); the
        # account administers the key and cannot use it (short of changing this policy: ``ADMIN_ACTIONS``). It replaces CDK's default policy, which
        # gives the account kms:* (every role with a broad IAM policy could then open secrets).
        self.key_policy = iam.PolicyDocument(statements=[iam.PolicyStatement(
            sid="KeyAdministration", principals=[iam.AccountRootPrincipal()], actions=list(ADMIN_ACTIONS),
            resources=["*"])])
        self.key = kms.Key(
            self, "Key", description="Seals devices' secrets and enrollments' group keys of the device-state API",
            enable_key_rotation=True, pending_window=Duration.days(7 if throwaway else 30),
            # Destroying it makes every registered secret and enrollment unusable: kept unless throwaway.
            removal_policy=RemovalPolicy.DESTROY if throwaway else RemovalPolicy.RETAIN)
        self.key.node.default_child.key_policy = self.key_policy
        self.environment = {SEALING_KMS_KEY: self.key.key_arn}

    def grant_seal(self, function: lambda_.Function) -> None:
        """Encrypt and Decrypt under the service's encryption context: in the key policy, and in
        the function's own role on this key only."""
        self.key_policy.add_statements(iam.PolicyStatement(
            sid="SealAndOpen", principals=[iam.ArnPrincipal(function.role.role_arn)], actions=list(SEAL_ACTIONS),
            resources=["*"], conditions=CONTEXT_CONDITION))
        function.add_to_role_policy(iam.PolicyStatement(actions=list(SEAL_ACTIONS), resources=[self.key.key_arn],
                                                        conditions=CONTEXT_CONDITION))
