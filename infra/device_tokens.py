"""The device-token issuer (functions/auth/device_tokens.py): an asymmetric KMS key that signs
device tokens (ECC_NIST_P256, SIGN_VERIFY; its private key never leaves KMS), its public key
read at deploy time into the JWKS the functions verify with, and the variables of both sides.

The public key is read by a custom resource (functions/auth/kms_jwks_resource.py) rather than
by each function at cold start: verification then needs no KMS call and no KMS right (the
authorizer and the push functions have none), a whole fleet reconnecting spends none of KMS's
request quota on it, and nothing fetches keys at request time, as for the main issuer.
KMS cannot rotate an asymmetric key: rotating is a new key and a deploy (docs/operations.md)."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import CustomResource, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import custom_resources
from constructs import Construct

from functions.auth import kms_jwks_resource
from functions.auth.credentials import DEVICE_TOKEN_AUDIENCE, DEVICE_TOKEN_ISSUER, DEVICE_TOKEN_JWKS
from functions.auth.device_tokens import (DEVICE_TOKEN_KMS_KEY, DEVICE_TOKEN_MAX_SECONDS,
                                          DEVICE_TOKEN_RENEWAL_SECONDS, DEVICE_TOKEN_SECONDS, TokenSettings)

from .api import ARCHITECTURE, LOG_RETENTION, RUNTIME

AUDIENCE = "device-state"
SIGN_ACTIONS = ("kms:Sign",)
# What the account (its administrators, through IAM) may do with the key: manage it, not use it.
# AWS's key-administrator actions but kms:CreateGrant (kms:Create* has it: a grant to oneself
# would use the key). kms:Put* keeps the key policy editable (KMS refuses a policy that locks
# out its own account), so using the key takes an administrator's change of the key policy
# first, which CloudTrail records.
ADMIN_ACTIONS = ("kms:CreateAlias", "kms:Describe*", "kms:Enable*", "kms:List*", "kms:Put*", "kms:Update*",
                 "kms:Revoke*", "kms:Disable*", "kms:Get*", "kms:Delete*", "kms:TagResource", "kms:UntagResource",
                 "kms:ScheduleKeyDeletion", "kms:CancelKeyDeletion")


class DeviceTokens(Construct):
    """``verification_environment``: what every function that authenticates callers reads;
    ``signing_environment``: what the API function alone reads (it alone may sign: ``grant_sign``)."""

    def __init__(self, scope: Construct, construct_id: str, *, throwaway: bool, lifetime_seconds: int,
                 max_seconds: int, renewal_seconds: int):
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        # The key policy names who may sign (the API function's role, ``grant_sign``) and read the
        # public key (the custom resource's role); the account administers the key and cannot
        # sign with it (short of changing this policy: ``ADMIN_ACTIONS``). It replaces CDK's default policy, which gives the account kms:* (every
        # role with a broad IAM policy could then sign device tokens).
        self.key_policy = iam.PolicyDocument(statements=[iam.PolicyStatement(
            sid="KeyAdministration", principals=[iam.AccountRootPrincipal()], actions=list(ADMIN_ACTIONS),
            resources=["*"])])
        self.key = kms.Key(
            self, "Key", description="Signs device tokens (POST /devices/{id}/token) of the device-state API",
            key_spec=kms.KeySpec.ECC_NIST_P256, key_usage=kms.KeyUsage.SIGN_VERIFY,
            enable_key_rotation=False,  # KMS rotates symmetric keys only; see the module docstring
            pending_window=Duration.days(7 if throwaway else 30),
            removal_policy=RemovalPolicy.DESTROY if throwaway else RemovalPolicy.RETAIN)
        self.key.node.default_child.key_policy = self.key_policy
        issuer = f"urn:device-state:{stack.stack_name}:device-tokens"
        self.verification_environment = {DEVICE_TOKEN_ISSUER: issuer, DEVICE_TOKEN_AUDIENCE: AUDIENCE,
                                         DEVICE_TOKEN_JWKS: self._public_jwks()}
        self.signing_environment = {DEVICE_TOKEN_KMS_KEY: self.key.key_arn,
                                    DEVICE_TOKEN_SECONDS: str(lifetime_seconds),
                                    DEVICE_TOKEN_MAX_SECONDS: str(max_seconds),
                                    DEVICE_TOKEN_RENEWAL_SECONDS: str(renewal_seconds)}
        # Checked as the API function will check them, so a bad context value fails the synth.
        TokenSettings.from_environment({**self.signing_environment, DEVICE_TOKEN_ISSUER: issuer,
                                        DEVICE_TOKEN_AUDIENCE: AUDIENCE,
                                        DEVICE_TOKEN_KMS_KEY: "arn:aws:kms:region:account:key/checked-at-synth"})

    def grant_sign(self, function: lambda_.Function) -> None:
        """kms:Sign with this key: in the key policy, and in the function's own role on this key only."""
        self._allow(function.role, SIGN_ACTIONS, "Sign")
        function.add_to_role_policy(iam.PolicyStatement(actions=list(SIGN_ACTIONS), resources=[self.key.key_arn]))

    def _allow(self, role: iam.IRole, actions, sid: str) -> None:
        self.key_policy.add_statements(iam.PolicyStatement(sid=sid, principals=[iam.ArnPrincipal(role.role_arn)],
                                                           actions=list(actions), resources=["*"]))

    def _public_jwks(self) -> str:
        log_group = logs.LogGroup(self, "PublicKeyLogs", retention=LOG_RETENTION)
        role = iam.Role(self, "PublicKeyRole", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        role.add_to_policy(iam.PolicyStatement(
            actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[log_group.log_group_arn]))
        role.add_to_policy(iam.PolicyStatement(actions=["kms:GetPublicKey"], resources=[self.key.key_arn]))
        self._allow(role, ("kms:GetPublicKey",), "ReadPublicKey")
        function = lambda_.Function(
            self, "PublicKeyFunction", runtime=RUNTIME, architecture=ARCHITECTURE, handler="index.on_event",
            code=lambda_.Code.from_inline(Path(kms_jwks_resource.__file__).read_text()),
            timeout=Duration.minutes(1), memory_size=128, role=role, log_group=log_group)
        framework_logs = logs.LogGroup(self, "PublicKeyProviderLogs", retention=LOG_RETENTION)
        framework_role = iam.Role(self, "PublicKeyProviderRole",
                                  assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        framework_role.add_to_policy(iam.PolicyStatement(
            actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[framework_logs.log_group_arn]))
        provider = custom_resources.Provider(self, "PublicKeyProvider", on_event_handler=function,
                                             log_group=framework_logs, framework_on_event_role=framework_role)
        resource = CustomResource(self, "PublicKey", service_token=provider.service_token,
                                  resource_type="Custom::DeviceTokenPublicKey",
                                  properties={"KeyArn": self.key.key_arn})
        return resource.get_att_string("Jwks")
