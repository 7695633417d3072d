// The OpenID provider the tests sign in with: panva's oidc-provider (OpenID Certified), configured from a
// JSON file (argv[2]): { port, issuer, clients: [...], users: { id: {email, name, groups} }, jwks: {keys} }.
// Its one addition is the interaction: no login page, the person named by the authorization request's
// `login_hint` is signed in and consents at once (a test is the browser; the protocol is the provider's).
import { readFileSync } from "node:fs";
import Provider from "oidc-provider";

const config = JSON.parse(readFileSync(process.argv[2], "utf8"));
const users = config.users;

const provider = new Provider(config.issuer, {
  clients: config.clients,
  jwks: config.jwks,
  findAccount: async (ctx, id) =>
    users[id] && {
      accountId: id,
      claims: async () => ({ sub: id, email: users[id].email, email_verified: true, name: users[id].name, groups: users[id].groups }),
    },
  claims: { openid: ["sub"], email: ["email", "email_verified"], profile: ["name"], groups: ["groups"] },
  scopes: ["openid", "email", "profile", "groups", "offline_access"],
  conformIdTokenClaims: false, // the person's claims in the ID token itself
  pkce: { required: () => true },
  features: {
    devInteractions: { enabled: false },
    rpInitiatedLogout: { enabled: true },
    deviceFlow: { enabled: true },
  },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  ttl: { AuthorizationCode: 60, IdToken: 3600, AccessToken: 3600, Session: 3600, Interaction: 600, Grant: 3600 },
});

provider.use(async (ctx, next) => {
  const found = ctx.path.match(/^\/interaction\/([^/]+)$/);
  if (!found) return next();
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  const accountId = details.params.login_hint || details.session?.accountId;
  if (!users[accountId]) {
    ctx.status = 400;
    ctx.body = `unknown login_hint ${accountId}`;
    return undefined;
  }
  if (details.prompt.name === "login") {
    return provider.interactionFinished(ctx.req, ctx.res, { login: { accountId } }, { mergeWithLastSubmission: false });
  }
  const grant = details.grantId ? await provider.Grant.find(details.grantId) : new provider.Grant({ accountId, clientId: details.params.client_id });
  grant.addOIDCScope(details.params.scope);
  const grantId = await grant.save();
  return provider.interactionFinished(ctx.req, ctx.res, { consent: { grantId } }, { mergeWithLastSubmission: true });
});

provider.listen(config.port, "127.0.0.1", () => console.log(`listening ${config.issuer}`));
