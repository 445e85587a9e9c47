"""Burn warnings and reminders by e-mail to a project's leads, over SMTP (the standard library's
smtplib; STARTTLS and a login where configured).

Who: the leads the plan names for the project and the groups above it (`ProjectBurn.leads`); an
address from `lead_emails` (`name:address,...`), else from `email_address_template` (`{name}` in
it). A lead with neither gets none (logged). When: as the webhooks are posted, once per crossing
(a warning raised, not its clearing). A server that refuses or is away is logged and counted
(`allmende_alert_mails_total{outcome="failed"}`), and the warning stays published: e-mail is a
courtesy beside the alerts topic, never a reason to publish again.
"""

from __future__ import annotations

import smtplib
from collections.abc import Sequence
from email.message import EmailMessage

import structlog

from allmende.core.metrics import ALERT_MAILS
from allmende.core.settings import Settings
from allmende.schemas.alert_events import BurnWarningRaised

log = structlog.get_logger(__name__)
SMTP_TIMEOUT_S = 10.0


def _addresses(spec: str) -> dict[str, str]:
    pairs = (item.split(":", 1) for item in spec.split(",") if ":" in item)
    return {name.strip(): address.strip() for name, address in pairs if name.strip() and "@" in address}


class AlertMailer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.known = _addresses(settings.lead_emails)
        self.template = settings.email_address_template
        if self.template:
            self.template.format(name="lead")  # a template naming another field fails at start
        if settings.smtp_username and not settings.smtp_starttls:
            raise ValueError("ALLMENDE_SMTP_USERNAME needs ALLMENDE_SMTP_STARTTLS=true: no password in clear")

    @staticmethod
    def enabled(settings: Settings) -> bool:
        return bool(settings.smtp_host)

    def address_of(self, lead: str) -> str | None:
        if lead in self.known:
            return self.known[lead]
        return self.template.format(name=lead) if "{name}" in self.template else None

    def message(self, event: BurnWarningRaised, to: Sequence[str]) -> EmailMessage:
        mail = EmailMessage()
        mail["From"] = self.settings.smtp_from
        mail["To"] = ", ".join(to)
        mail["Subject"] = f"[Allmende] {event.project} {event.period}: {event.condition}"
        mail["Message-ID"] = f"<{event.event_id.replace('/', '.').replace(':', '.')}@allmende>"
        mail.set_content(f"{event.message}\n\n-- \nAllmende GPU budgets (alert {event.event_id})\n")
        return mail

    def send(self, event: BurnWarningRaised, leads: Sequence[str]) -> bool:
        """Mail the warning to the leads with an address; whether the server took it. Never
        raises: a mail is a courtesy beside the published warning."""
        try:
            return self._send(event, leads)
        except Exception as exc:  # a template naming another field, a header the server refuses...
            ALERT_MAILS.labels("failed").inc()
            log.warning("alert_mail_failed", event_id=event.event_id, error=repr(exc))
            return False

    def _send(self, event: BurnWarningRaised, leads: Sequence[str]) -> bool:
        to = sorted({a for lead in leads if (a := self.address_of(lead))})
        if not to:
            log.info(
                "alert_mail_no_recipient", event_id=event.event_id, project=event.project, leads=list(leads)
            )
            return False
        s = self.settings
        try:
            with smtplib.SMTP(s.smtp_host, s.smtp_port, timeout=SMTP_TIMEOUT_S) as smtp:
                if s.smtp_starttls:
                    smtp.starttls()
                if s.smtp_username:
                    smtp.login(s.smtp_username, s.smtp_password)
                smtp.send_message(self.message(event, to))
        except (OSError, smtplib.SMTPException) as exc:
            ALERT_MAILS.labels("failed").inc()
            log.warning("alert_mail_failed", event_id=event.event_id, error=repr(exc))
            return False
        ALERT_MAILS.labels("sent").inc()
        log.info("alert_mail_sent", event_id=event.event_id, to=to)
        return True
